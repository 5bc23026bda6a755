"""N simulated replicas behind a router: how a replica count is checked, not just divided out.

Each replica is its own scheduler + backend + driver coroutine, all on one VirtualClock. A router
coroutine (run/router.py picks the replica) releases the trace at its planned arrival times. A
replica that is mid-batch sees its new request when the batch ends, but the request keeps its
planned arrival stamp, so queueing behind a busy replica is measured. The replicas' drivers
share one Occupancy, so the Little's-law check counts the whole system: the sum over replicas.
"""
from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field

from batchlab.backends.base import Backend
from batchlab.core.clock import Clock
from batchlab.core.config import RunConfig
from batchlab.core.request import Request
from batchlab.core.traffic import TraceItem, make_requests
from batchlab.run.driver import Inbox, Occupancy, drive
from batchlab.run.router import ROUTERS, Router
from batchlab.schedulers import Scheduler, make_scheduler


@dataclass(eq=False)
class Replica:
    index: int
    backend: Backend
    scheduler: Scheduler
    inbox: Inbox = field(default_factory=lambda: Inbox(live=True))
    outstanding: int = 0              # assigned, not yet finished or failed
    assigned: list[str] = field(default_factory=list)   # request ids, in routing order

    def take(self, request: Request) -> None:
        self.outstanding += 1
        self.assigned.append(request.request_id)
        self.inbox.push(request)

    def done(self, request: Request) -> None:
        self.outstanding -= 1

    def cached_tokens(self, request: Request) -> int:
        return self.scheduler.cached_tokens(request)


def make_replicas(cfg: RunConfig, strategy: str, backend: Backend, n: int) -> list[Replica]:
    """n independent copies of `backend` (the simulator holds no shared state), each with a scheduler."""
    out = []
    for i in range(n):
        b = backend if i == 0 else copy.deepcopy(backend)
        sched = make_scheduler(strategy, cfg, b.memory_budget(), b.num_kv_blocks(cfg.continuous.block_size))
        out.append(Replica(i, b, sched))
    return out


async def route(requests: list[Request], replicas: list[Replica], router: Router, clock: Clock) -> None:
    """Release each request at its planned arrival time to the replica the router picks."""
    for r in sorted(requests, key=lambda r: (r.arrival_time, r.index)):
        await clock.sleep_until(r.arrival_time)   # exactly the planned time, as the driver does
        router.pick(replicas, r).take(r)
    for rep in replicas:
        rep.inbox.close()


async def serve_replicated(requests: list[Request], replicas: list[Replica], router: Router, clock: Clock,
                           occupancy: Occupancy | None = None) -> None:
    """Run the replicas' drivers and the router together until every request is done."""
    drivers = [asyncio.ensure_future(drive(rep.scheduler, rep.backend, clock, rep.inbox, on_done=rep.done,
                                           occupancy=occupancy))
               for rep in replicas]
    try:
        await route(requests, replicas, router, clock)
        await asyncio.gather(*drivers)
    finally:
        for d in drivers:
            d.cancel()


async def run_replicas(cfg: RunConfig, strategy: str, trace: list[TraceItem], backend: Backend,
                       clock: Clock, occupancy: Occupancy | None = None) -> tuple[list[Request], float]:
    """`run_trace` for `backend.replicas` > 1: same inputs, same outputs, N replicas inside."""
    replicas = make_replicas(cfg, strategy, backend, cfg.backend.replicas)
    t0 = clock.now()
    requests = make_requests(trace, t0, backend.prepare)
    await serve_replicated(requests, replicas, ROUTERS[cfg.backend.router](), clock, occupancy)
    return requests, t0
