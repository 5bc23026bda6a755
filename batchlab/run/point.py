"""One sweep point: a trace, a strategy, a backend, a clock -> stamped requests and a summary.

The simulator runs on a VirtualClock; real backends on the RealClock. An engine runs the point
under the strategy's scheduler and the driver; a load target (it batches for itself) is handed
the trace instead: the choice is made once, here. Times in the results are seconds from the point's
start (the clock reading when the first planned arrival is offset 0).
The driver(s) keep their own count of requests in the system (run/driver.py Occupancy) for the
Little's-law check over [warm-up end, end of traffic]; a server backend has no driver, so there
the check falls back to the count the stamps give (summary column little_source).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from batchlab.backends.base import Backend, Engine, LoadTarget
from batchlab.core.clock import Clock, RealClock, VirtualClock
from batchlab.core.closed_loop import follow_ups
from batchlab.core.config import RunConfig
from batchlab.core.metrics import measured, prefix_cache, stamped_in_system, summarize
from batchlab.core.request import Request
from batchlab.core.traffic import TraceItem, build_trace, make_requests
from batchlab.run.driver import Inbox, Occupancy, drive, given
from batchlab.schedulers import make_scheduler, scheduler_class


@dataclass
class PointResult:
    strategy: str
    rate: float
    repeat: int
    requests: list[Request]
    summary: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    in_system: list[tuple[float, int]] = field(default_factory=list)   # Little's-law count: (s, +-1), see little_source


def runnable(requests: list[Request]) -> list[Request]:
    return [r for r in requests if not r.is_done]


async def run_trace(cfg: RunConfig, strategy: str, trace: list[TraceItem], backend: Backend,
                    clock: Clock, occupancy: Occupancy | None = None) -> tuple[list[Request], float]:
    """Run one strategy over one trace; returns the requests and the run's start time. The role
    is chosen here, once: a load target sends the trace itself (it batches for itself); an engine
    is driven under the strategy's scheduler. `occupancy` collects the driver's count of requests
    in the system (untouched by a load target)."""
    if isinstance(backend, LoadTarget):
        return await backend.run_trace(trace, clock, cfg.traffic, workers=cfg.loadgen.workers, spread=cfg.loadgen.kind)
    return await drive_trace(cfg, strategy, trace, backend, clock, occupancy)


async def drive_trace(cfg: RunConfig, strategy: str, trace: list[TraceItem], backend: Engine,
                      clock: Clock, occupancy: Occupancy | None = None) -> tuple[list[Request], float]:
    """An engine under the strategy's scheduler and the driver (N replicas behind a router if
    the backend config asks for them)."""
    if cfg.backend.replica_count() > 1:
        from batchlab.run.replicas import run_replicas
        return await run_replicas(cfg, strategy, trace, backend, clock, occupancy)
    facts = backend.facts()
    t0 = clock.now()
    requests = make_requests(trace, t0, backend.prepare, facts.vocab_size)
    # closed-loop users and sessions: later requests come from the driver, as answers end
    talks = follow_ups(cfg.traffic, trace, requests, clock, t0, facts.vocab_size, backend.prepare)
    scheduler = make_scheduler(strategy, cfg, given(cfg, facts, live=False, sessions=talks is not None))
    await drive(scheduler, backend, clock, Inbox(runnable(requests), delay_s=facts.arrival_delay_s,
                                                engine_s=facts.frontend_engine_s,
                                                engine_s_per_token=facts.frontend_engine_s_per_token), occupancy=occupancy,
                next_turn=talks.next_turn if talks else None)
    return (talks.requests() if talks else requests), t0


def run_point(cfg: RunConfig, strategy: str, rate: float, repeat: int, backend: Backend,
              trace: list[TraceItem] | None = None) -> PointResult:
    trace = trace if trace is not None else build_trace(cfg.traffic, rate, repeat)
    clock: Clock = VirtualClock() if backend.virtual_time else RealClock()
    occupancy = Occupancy()

    async def main():
        await backend.start(clock)
        backend.reset_peak_memory()
        return await run_trace(cfg, strategy, trace, backend, clock, occupancy)

    wall = time.perf_counter()
    requests, t0 = clock.run(main())
    wall = time.perf_counter() - wall
    requests = rebased(requests, t0)
    # NOTE: without a driver (a server) the stamps' count stands in, over every request, warm-up
    # ones too, so both edges of the window are counted alike (summary column little_source)
    in_system, source = ((occupancy.rebased(t0), "driver") if occupancy.changes
                         else (stamped_in_system(requests), "stamps"))
    counted = measured(requests, cfg.traffic.warmup_s)
    summary = summarize(counted, cfg.slo, in_system, (cfg.traffic.warmup_s, traffic_end(cfg, requests)),
                        closed=cfg.traffic.arrival == "closed") | {"little_source": source}
    if cfg.continuous.prefix_caching and isinstance(backend, Engine) and scheduler_class(strategy).level == "iteration":
        summary |= prefix_cache(counted, cfg.continuous.block_size)     # columns only where a cache ran
    meta = {"wall_s": wall, **backend.peak_memory(),
            **backend.point_facts(t0 + cfg.traffic.warmup_s, summary)}
    return PointResult(strategy, rate, repeat, requests, summary, meta, in_system)


def traffic_end(cfg: RunConfig, requests: list[Request]) -> float:
    """When the offered traffic stops: the configured horizon, or a trace file's last arrival."""
    if cfg.traffic.arrival == "trace":
        return max((r.arrival_time for r in requests), default=0.0)
    return cfg.traffic.warmup_s + cfg.traffic.duration_s


def rebased(requests: list[Request], t0: float) -> list[Request]:
    """Express every stamp in seconds from the point's start."""
    if t0 == 0.0:
        return requests
    for r in requests:
        r.arrival_time -= t0
        if r.scheduled_time is not None:
            r.scheduled_time -= t0
        r.token_times[:] = [t - t0 for t in r.token_times]
    return requests
