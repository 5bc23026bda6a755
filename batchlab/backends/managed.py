"""A managed baseline as a load target (backends/baselines.py describes each): the server is
started for one point's trace and stopped after it, whatever happens (an error, Ctrl-C); a server left by a run that was killed is found by
its state file (backends/process.py) and stopped before the next one starts.

Between start and stop it is an OpenAI-compatible server like any other: the trace is sent through
the OpenAI client at its planned times, each request's chunks stamped as they arrive. Starting is
not part of any request's latency: the first planned arrival is offset 0 only once the server
answers. A fresh server per point also means no point inherits another's cache or queue.
"""
from __future__ import annotations

import json
from typing import Any

from batchlab.backends import process
from batchlab.backends.baselines import Launch, options
from batchlab.backends.model_shape import find_config, hub_cache_dir
from batchlab.backends.openai_client import OpenAIBackend
from batchlab.backends.tiny import resolve_model
from batchlab.core.clock import Clock
from batchlab.core.config import TrafficConfig
from batchlab.core.request import Request
from batchlab.core.trace_item import TraceItem
from batchlab.errors import ConfigError


class ManagedServer(OpenAIBackend):
    """`launch`'s server for the length of each trace sent to it, pinned to `cpus` (None: unpinned)."""

    def __init__(self, launch: Launch, cpus: str | None, facts: dict[str, Any], echo=lambda line: None):
        super().__init__(launch.url, launch.served, prompt_format=launch.prompt_format,
                         length_control=launch.length_control)
        self.launch, self.cpus, self.facts, self.echo = launch, cpus, facts, echo

    async def run_trace(self, trace: list[TraceItem], clock: Clock, traffic: TrafficConfig | None = None,
                        per_user: int | None = None, **split) -> tuple[list[Request], float]:
        # NOTE: blocking while the server starts and stops: nothing else runs in this point's loop then
        with process.managed(self.launch.name, self.launch.cmd, self.launch.url, self.launch.served,
                             self.launch.env, self.cpus, self.launch.wait_s, self.echo):
            return await super().run_trace(trace, clock, traffic, per_user, **split)

    def describe(self) -> dict[str, Any]:
        return {**self.facts, "url": self.launch.url, "cpus": self.cpus or "unpinned"}


def model_dir(model: str | None) -> tuple[str, int]:
    """The local directory a server can load the engine's model from (a model directory, or a hub
    name's snapshot in the local cache: no download), and its context length (config.json's
    max_position_embeddings, at most 4,096 here); ConfigError for a model that exists only as a
    shape (random:...) or is neither on disk nor in the cache."""
    if model and model.startswith("random:"):
        raise ConfigError(f"a baseline server needs the model's files; backend.model {model!r} is a shape with "
                          "random weights that only batchlab builds")
    name = resolve_model(model)
    try:
        config = find_config(name)
    except ConfigError:
        raise ConfigError(f"a baseline server needs the model's files: backend.model {model!r} is neither a "
                          f"directory with config.json nor in the local hub cache ({hub_cache_dir()})") from None
    context = json.loads(config.read_text()).get("max_position_embeddings") or 2048
    return str(config.parent), min(int(context), 4096)

def check_baselines(cfg: Any, names: list[str]) -> list[str]:
    """Before anything is written: every baseline of the sweep can start here (installed, at the
    version asked for, on a model with files) and its points run on this machine. Raises
    ConfigError (one line, with the command that installs what is missing); returns no warnings."""
    if not names:
        return []
    if cfg.executor.kind != "local":
        raise ConfigError(f"strategies {', '.join(names)}: a managed baseline's server runs on this machine, beside "
                          f"the engine; executor.kind must be local, not {cfg.executor.kind}")
    model_dir(cfg.backend.model)
    for name in names:
        options(cfg, name).check()
    return []


def prepare_baselines(cfg: Any, names: list[str], echo) -> tuple[str | None, dict[str, Any]]:
    """Before a sweep's first point: stop the baseline servers a killed run left behind (each
    would hold its port, and vLLM a busy core, under the engine's points), then give servers a
    core of their own where there are two (this process, the engine and the load generator, on
    core 0). Returns the servers' cores (None: unpinned) and what setup.json records."""
    mine = {f"baseline-{n}" for n in names}
    for old in process.orphans():
        if old.server in mine:
            echo(f"warning: stopping {old.server} (pid {old.pid}), left running at {old.url} by an earlier run")
            process.stop(old.server, echo=echo)
    cpus = process.split_cores()
    cores = (f"engine and load generator on core {process.CLIENT_CPU}, baseline servers on core {cpus}" if cpus
             else "unpinned (one core, or no taskset)")
    return cpus, {"cores": cores, **{n: {"version": options(cfg, n).version(), "flags": options(cfg, n).limits().given()}
                                     for n in names}}

