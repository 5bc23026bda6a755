"""One sweep point: a trace, a strategy, a backend, a clock -> stamped requests and a summary.

The simulator runs on a VirtualClock; real backends on the RealClock. Either way the same
scheduler class and the same driver run the point. Times in the results are seconds from the
point's start (the clock reading when the first planned arrival is offset 0).
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from batchlab.backends.base import Backend
from batchlab.core.clock import Clock, RealClock, VirtualClock
from batchlab.core.config import ConfigError, RunConfig
from batchlab.run.driver import Inbox, drive
from batchlab.core.metrics import measured, summarize
from batchlab.core.request import Request
from batchlab.core.traffic import TraceItem, build_trace
from batchlab.schedulers import make_scheduler

# backend.kind -> "module:factory"; imported lazily so the simulator never imports torch.
BACKENDS: dict[str, str] = {
    "sim": "batchlab.backends.simulated:from_config",
    "hf": "batchlab.backends.hf:from_config",
    "hf-cb": "batchlab.backends.hf_cb:from_config",
    "openai": "batchlab.backends.openai:from_config",
}


def make_backend(cfg: RunConfig) -> Backend:
    target = BACKENDS[cfg.backend.kind]
    module, name = target.split(":")
    try:
        factory: Callable[[RunConfig], Backend] = getattr(importlib.import_module(module), name)
    except ImportError as e:
        extra = "serve" if cfg.backend.kind == "openai" else "hf"
        raise ConfigError(f"backend.kind '{cfg.backend.kind}' needs the '{extra}' extra "
                          f"(pip install 'batchlab[{extra}]'): {e}") from None
    return factory(cfg)


@dataclass
class PointResult:
    strategy: str
    rate: float
    repeat: int
    requests: list[Request]
    summary: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def make_requests(trace: list[TraceItem], t0: float, backend: Backend) -> list[Request]:
    """One request per trace item, prepared by the backend. A request the backend refuses
    (empty prompt, longer than the model's context) is recorded as failed with the reason,
    as a server would answer it with a 400: it stays in the results, it never runs."""
    reqs = []
    for i, item in enumerate(trace):
        r = Request(f"r{i:06d}", item.prompt_len, item.output_len, t0 + item.arrival,
                    prompt=item.prompt, index=i)
        try:
            backend.prepare(r)
        except ValueError as e:
            r.fail(f"invalid request: {e}")
        reqs.append(r)
    return reqs


def runnable(requests: list[Request]) -> list[Request]:
    return [r for r in requests if not r.is_done]


async def run_trace(cfg: RunConfig, strategy: str, trace: list[TraceItem], backend: Backend,
                    clock: Clock) -> tuple[list[Request], float]:
    """Drive one strategy over one trace; returns the requests and the run's start time."""
    if hasattr(backend, "run_trace"):       # servers batch for themselves (backends/openai.py)
        return await backend.run_trace(trace, clock)
    if cfg.backend.kind == "sim" and cfg.backend.replicas > 1:   # N replicas behind a router
        from batchlab.run.replicas import run_replicas
        return await run_replicas(cfg, strategy, trace, backend, clock)
    scheduler = make_scheduler(strategy, cfg, backend.memory_budget(),
                               backend.num_kv_blocks(cfg.continuous.block_size))
    t0 = clock.now()
    requests = make_requests(trace, t0, backend)
    await drive(scheduler, backend, clock, Inbox(runnable(requests)))
    return requests, t0


def run_point(cfg: RunConfig, strategy: str, rate: float, repeat: int, backend: Backend,
              trace: list[TraceItem] | None = None) -> PointResult:
    trace = trace if trace is not None else build_trace(cfg.traffic, rate, repeat)
    clock: Clock = VirtualClock() if backend.virtual_time else RealClock()

    async def main():
        await backend.start(clock)
        backend.reset_peak_memory()
        return await run_trace(cfg, strategy, trace, backend, clock)

    wall = time.perf_counter()
    requests, t0 = clock.run(main())
    wall = time.perf_counter() - wall
    _rebase(requests, t0)
    summary = summarize(measured(requests, cfg.traffic.warmup_s), cfg.slo)
    meta = {"wall_s": wall, **backend.peak_memory(), **getattr(backend, "run_meta", dict)(),
            **_efficiency(backend, strategy, t0 + cfg.traffic.warmup_s, summary)}
    return PointResult(strategy, rate, repeat, requests, summary, meta)


def _efficiency(backend: Backend, strategy: str, measured_from: float, summary: dict) -> dict[str, float]:
    """Continuous runs on a real step engine: achieved tok/s over what its own measured step
    time allows at the run's occupancy (backend_eff, below 1 = idle time and overhead)."""
    engine = getattr(backend, "engine", None)
    if strategy != "continuous" or engine is None or not hasattr(engine, "step_log"):
        return {}
    from batchlab.backends.hf_engine import backend_efficiency
    records = [s for s in engine.step_log if s.start >= measured_from]
    return backend_efficiency(records, summary["throughput_tok_s"])


def _rebase(requests: list[Request], t0: float) -> None:
    """Express every stamp in seconds from the point's start."""
    if t0 == 0.0:
        return
    for r in requests:
        r.arrival_time -= t0
        if r.scheduled_time is not None:
            r.scheduled_time -= t0
        r.token_times[:] = [t - t0 for t in r.token_times]
