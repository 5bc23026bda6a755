"""N simulated replicas behind a router: how a replica count is checked, not just divided out.

Each replica is its own scheduler + backend + driver coroutine, all on one VirtualClock. A router
coroutine (run/router.py picks the replica) releases the trace at its planned arrival times. A
replica that is mid-batch sees its new request when the batch ends, but the request keeps its
planned arrival stamp, so queueing behind a busy replica is measured. The replicas' drivers
share one Occupancy, so the Little's-law check counts the whole system: the sum over replicas.
With traffic.sessions a turn handed back by any replica plans its session's next turn (a closed
loop's answer, its user's next request), which the router places like any arrival, at its time
(`SessionRouting`); the inboxes close only when the trace is out and every session has ended.
"""
from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field

from batchlab.backends.base import Engine
from batchlab.core.clock import Clock
from batchlab.core.closed_loop import ClosedLoop, follow_ups
from batchlab.core.config import RunConfig
from batchlab.core.request import Request
from batchlab.core.sessions import Conversations
from batchlab.core.traffic import TraceItem, make_requests
from batchlab.run.driver import Inbox, Occupancy, drive, given
from batchlab.run.router import ROUTERS, Router
from batchlab.schedulers import Scheduler, make_scheduler


@dataclass(eq=False)
class Replica:
    index: int
    backend: Engine
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


def make_replicas(cfg: RunConfig, strategy: str, backend: Engine, n: int) -> list[Replica]:
    """n independent copies of `backend` (the simulator holds no shared state), each with a scheduler.
    NOTE: a replica's inbox is live (the router feeds it), so its scheduler offers no decode windows."""
    out = []
    for i in range(n):
        b = backend if i == 0 else copy.deepcopy(backend)
        out.append(Replica(i, b, make_scheduler(strategy, cfg, given(cfg, b.facts(), live=True))))
    return out


class SessionRouting:
    """Sessions across replicas: each turn handed back plans the next one (core/sessions.py),
    delivered at its arrival time to the replica the router picks then; counts the sessions
    still open, so the router knows when no more requests can come.
    NOTE: once the trace is out and no turn is on its way, more requests come only if a replica
    runs what waits there: the inboxes are then marked quiet (Inbox.draining), or naive batching
    would wait for a full batch that only its own answers could fill."""

    def __init__(self, talks: Conversations | ClosedLoop, first_turns: list[Request], replicas: list[Replica], router: Router,
                 clock: Clock, delay_s: float = 0.0):
        self.talks, self.replicas, self.router, self.clock = talks, replicas, router, clock
        self.delay_s = delay_s                # the engines' front end: a turn reaches a replica this late
        self.open = sum(1 for r in first_turns if not r.is_done)   # refused first turns never start
        self.ended = asyncio.Event()
        if self.open == 0:
            self.ended.set()
        self.deliveries: list[asyncio.Future] = []
        self.on_the_way = 0                  # turns planned, not yet delivered
        self.trace_out = False               # route has released the whole trace

    def handed_back(self, r: Request) -> None:
        nxt = self.talks.next_turn(r)
        if nxt is not None:
            self.on_the_way += 1
            self._mark()
            self.deliveries.append(asyncio.ensure_future(self._deliver(nxt)))
            return
        self.open -= 1
        if self.open == 0:
            self.ended.set()

    def released_trace(self) -> None:
        self.trace_out = True
        self._mark()

    async def _deliver(self, r: Request) -> None:
        await self.clock.sleep_until(r.arrival_time + self.delay_s)      # exactly the planned time, as route does
        self.on_the_way -= 1
        self.router.pick(self.replicas, r).take(r)
        self._mark()

    def _mark(self) -> None:
        quiet = self.trace_out and self.on_the_way == 0
        for rep in self.replicas:
            if quiet and not rep.inbox.quiet:
                rep.inbox.event.set()        # wake an idle driver to drain
            rep.inbox.quiet = quiet


async def route(requests: list[Request], replicas: list[Replica], router: Router, clock: Clock,
                sessions: SessionRouting | None = None, delay_s: float = 0.0) -> None:
    """Release each request at its planned arrival time (plus the engines' front end) to the
    replica the router picks."""
    for r in sorted(requests, key=lambda r: (r.arrival_time, r.index)):
        await clock.sleep_until(r.arrival_time + delay_s)   # exactly the planned time, as the driver does
        router.pick(replicas, r).take(r)
    if sessions is not None:
        sessions.released_trace()
        await sessions.ended.wait()                # later turns still come until every session ended
    for rep in replicas:
        rep.inbox.close()


async def serve_replicated(requests: list[Request], replicas: list[Replica], router: Router, clock: Clock,
                           occupancy: Occupancy | None = None, sessions: SessionRouting | None = None,
                           delay_s: float = 0.0) -> None:
    """Run the replicas' drivers and the router together until every request is done."""
    def on_done(rep: Replica):
        if sessions is None:
            return rep.done

        def done(r: Request) -> None:
            rep.done(r)
            sessions.handed_back(r)
        return done
    drivers = [asyncio.ensure_future(drive(rep.scheduler, rep.backend, clock, rep.inbox, on_done=on_done(rep),
                                           occupancy=occupancy))
               for rep in replicas]
    try:
        await route(requests, replicas, router, clock, sessions, delay_s)
        await asyncio.gather(*drivers)
    finally:
        for d in drivers:
            d.cancel()


async def run_replicas(cfg: RunConfig, strategy: str, trace: list[TraceItem], backend: Engine,
                       clock: Clock, occupancy: Occupancy | None = None) -> tuple[list[Request], float]:
    """`run_trace` for `backend.replicas` > 1: same inputs, same outputs, N replicas inside."""
    replicas = make_replicas(cfg, strategy, backend, cfg.backend.replica_count())
    router = ROUTERS[cfg.backend.router]()
    t0 = clock.now()
    facts = backend.facts()
    requests = make_requests(trace, t0, backend.prepare, facts.vocab_size)
    talks = follow_ups(cfg.traffic, trace, requests, clock, t0, facts.vocab_size, backend.prepare)
    sessions = None if talks is None else SessionRouting(talks, requests, replicas, router, clock,
                                                         facts.arrival_delay_s)
    await serve_replicated(requests, replicas, router, clock, occupancy, sessions, facts.arrival_delay_s)
    return (sessions.talks.requests() if sessions else requests), t0
