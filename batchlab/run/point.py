"""One sweep point: a trace, a strategy, a backend, a clock -> stamped requests and a summary.

The simulator runs on a VirtualClock; real backends on the RealClock. Either way the same
scheduler class and the same driver run the point; a backend that batches for itself (a
ServerBackend) is handed the trace instead. Times in the results are seconds from the point's
start (the clock reading when the first planned arrival is offset 0).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from batchlab.backends.base import Backend, ServerBackend
from batchlab.core.clock import Clock, RealClock, VirtualClock
from batchlab.core.config import RunConfig
from batchlab.core.metrics import measured, summarize
from batchlab.core.request import Request
from batchlab.core.traffic import TraceItem, build_trace, make_requests
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import make_scheduler


@dataclass
class PointResult:
    strategy: str
    rate: float
    repeat: int
    requests: list[Request]
    summary: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def runnable(requests: list[Request]) -> list[Request]:
    return [r for r in requests if not r.is_done]


async def run_trace(cfg: RunConfig, strategy: str, trace: list[TraceItem], backend: Backend,
                    clock: Clock) -> tuple[list[Request], float]:
    """Drive one strategy over one trace; returns the requests and the run's start time."""
    if isinstance(backend, ServerBackend):          # the server batches for itself
        return await backend.run_trace(trace, clock)
    if cfg.backend.kind == "sim" and cfg.backend.replicas > 1:   # N replicas behind a router
        from batchlab.run.replicas import run_replicas
        return await run_replicas(cfg, strategy, trace, backend, clock)
    scheduler = make_scheduler(strategy, cfg, backend.memory_budget(),
                               backend.num_kv_blocks(cfg.continuous.block_size))
    t0 = clock.now()
    requests = make_requests(trace, t0, backend.prepare)
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
    summary = summarize(measured(_rebased(requests, t0), cfg.traffic.warmup_s), cfg.slo)
    meta = {"wall_s": wall, **backend.peak_memory(),
            **backend.point_facts(t0 + cfg.traffic.warmup_s, summary)}
    return PointResult(strategy, rate, repeat, requests, summary, meta)


def _rebased(requests: list[Request], t0: float) -> list[Request]:
    """Express every stamp in seconds from the point's start."""
    if t0 == 0.0:
        return requests
    for r in requests:
        r.arrival_time -= t0
        if r.scheduled_time is not None:
            r.scheduled_time -= t0
        r.token_times[:] = [t - t0 for t in r.token_times]
    return requests
