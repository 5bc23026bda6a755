"""The `hf` backend kind: a Hugging Face model batchlab drives (config, build, preflight).

Request-level strategies run it through `generate()` (backends/hf_backend.py), iteration-level
ones through our step engine (backends/hf_engine.py). The model is loaded with `from_pretrained`
from a hub name (cached), a local path, `tiny` (a random Llama built locally) or
`random:<shape>` (a published architecture with random weights). torch and transformers are
imported only when the backend is built or checked.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from batchlab.backends.base import BackendOptions, Holds


class ModelOptions(BackendOptions):
    """What every Hugging Face kind reads: the model, where it runs, and its memory."""
    kind: str
    extra = "hf"
    model: str | None = None
    """A hub name (cached), a local path, `tiny` (the locally built tiny Llama, cached in
    <repo>/.data/tiny-llama or $BATCHLAB_DATA), or `random:<shape>` (random weights; no download)."""
    dtype: Literal["auto", "float32", "fp32", "float16", "fp16", "bfloat16", "bf16"] = "auto"
    """auto: fp16 on a GPU, fp32 on a CPU."""
    device: str = "auto"
    """auto, cpu, cuda, cuda:N or mps."""
    threads: Annotated[int, Field(gt=0, le=1024)] | None = None
    """On a CPU: torch intra-op threads (unset: torch's default)."""
    memory_budget_bytes: Annotated[int, Field(gt=0, le=1 << 50)] | None = None
    """KV budget for dynamic batching's memory trigger and the KV blocks (unset: on a GPU, free memory
    plus PyTorch's cached-but-free blocks less twice what a warm-up batch needed beyond its KV; on a
    CPU, 1 GiB)."""
    warmup_batches: Annotated[int, Field(ge=0, le=1000)] = 2
    """Batches run before measuring."""

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d{1,3})?", v):
            raise ValueError("expected auto, cpu, cuda, cuda:N or mps")
        return v

    def preflight(self, cfg) -> list[str]:
        from batchlab.backends.hf_common import preflight
        return preflight(cfg)

    def model_names(self) -> tuple[str, ...]:
        name = self.model or "tiny"
        return tuple(dict.fromkeys([name, Path(name).name]))

    def holds(self, gpus_on_node: int, node_cpus: int) -> Holds:
        """A GPU when it runs on one, else as many CPUs as it runs torch threads."""
        if self.device.startswith("cuda") or (self.device == "auto" and gpus_on_node > 0):
            return Holds(1, gpus=1)
        return Holds(self.threads or node_cpus)


class HFOptions(ModelOptions):
    """A Hugging Face model batchlab drives: `generate()` for request-level strategies, our step
    engine for iteration-level ones."""
    kind: Literal["hf"] = "hf"
    """A Hugging Face model batchlab drives."""
    compile: bool = False
    """Continuous: decode-only passes padded to row buckets and compiled (torch.compile; CUDA
    graphs on CUDA), built at start-up; mixed steps stay eager."""
    fused: bool | None = None
    """Continuous: the step engine's pass written out for Llama, Mistral and Qwen2 models (q/k/v
    and gate/up each one matrix product, no module calls; tokens identical). Unset: on for those
    models on a CPU; true: required; false: through transformers' modules."""

    hosts_baselines = True

    def preflight(self, cfg) -> list[str]:
        warnings = super().preflight(cfg)
        if self.fused:                  # required: refused from the model's config, before anything is written
            from batchlab.backends.hf_common import require_fused
            require_fused(self.model)
        return warnings

    def check_baselines(self, cfg, names: list[str]) -> list[str]:
        from batchlab.backends.managed import check_baselines
        return check_baselines(cfg, names)

    def prepare_baselines(self, cfg, names: list[str], echo):
        from batchlab.backends.managed import prepare_baselines
        return prepare_baselines(cfg, names, echo)

    def baseline(self, cfg, name: str, cpus: str | None):
        from batchlab.backends.baselines import options
        from batchlab.backends.managed import ManagedServer, model_dir
        opts = options(cfg, name)
        path, context = model_dir(self.model)
        launch = opts.launch(path, server_dtype(self.dtype, self.device), context, cpus)
        return ManagedServer(launch, cpus, {"baseline": name, "version": opts.version(), "model": path,
                                            "flags": opts.limits().given(), "command": launch.cmd})

    def build(self, cfg):
        from batchlab.backends.hf_backend import HFBackend, typical_len
        shape = (cfg.dynamic.max_batch_size, typical_len(cfg.traffic.prompt_len, 128), 8)
        return HFBackend(self, warmup_shape=shape, decode_rows=cfg.continuous.max_num_seqs)


def server_dtype(dtype: str, device: str) -> str:
    """The dtype a baseline server runs the model in: the engine's, by the servers' names (auto:
    float32 on a CPU, as the engine, else float16)."""
    named = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)
    if named != "auto":
        return named
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "float32" if device == "cpu" else "float16"
