"""The driver: the one loop that connects a scheduler, a backend and a clock.

It releases arrived requests into the scheduler, asks it what to run, runs that on the backend
and reports back. Arrivals are released at their *planned* times (the trace says when a user
sent them), so a request that arrives while a batch runs is stamped correctly even though the
scheduler only sees it afterwards. Live requests (the HTTP server) are pushed in with their
arrival already stamped. Failed requests keep their status and error and are reported too.
A server never knows that no more requests will come, so a live inbox may declare the traffic
paused after `flush_idle_s` without arrivals: the scheduler is then told it is draining, exactly
as at the end of a trace (naive batching would otherwise strand its last partial batch).
Given an `Occupancy`, the driver also keeps its own count of requests in the system, which the
Little's-law check (core/metrics.py) holds against the stamps.
Given `next_turn` (traffic.sessions, core/sessions.py), every request handed back may plan its
session's next turn, at a time the answer's last token decided: the inbox takes it like a trace
arrival, so the same loop runs closed-loop traffic on either clock.
"""
from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable, Iterable

from batchlab.backends.base import Engine, EngineFacts, OutOfMemory
from batchlab.core.breakdown import charge_launch, charge_stall, finish
from batchlab.core.clock import Clock
from batchlab.core.config import RunConfig
from batchlab.core.request import Request, Status
from batchlab.core.work import Batch, Idle, Step
from batchlab.schedulers.base import Given, Scheduler

Callback = Callable[[Request], None]
NextTurn = Callable[[Request], Request | None]
Progress = Callable[[list[Request]], None]
POLL_S = 0.001           # how often a running request-level batch is checked for new tokens (on_progress)


class Occupancy:
    """The driver's own count of requests in the system (its waiting + running), for the
    Little's-law check: kept as changes (time, +1 or -1), one append per arrival and departure.
    A request counts from its planned arrival, copied when the driver releases it (a request
    that arrived while a batch ran is released after the fact, so changes are not in time order),
    until the driver hands it back. A finished request leaves at its last token as stamped at
    hand-back, never later than the hand-back (a row of a request-level batch ends before its
    batch returns, and only the backend saw when); a stamp changed afterwards, or one later than
    the hand-back, shows in the check. A failed request is taken out of the count altogether
    (its arrival is cancelled): it has no E2E for lambda x W. Drivers of several replicas may
    share one Occupancy: their changes then sum to the whole system's count."""

    __slots__ = ("changes", "_since")

    def __init__(self) -> None:
        self.changes: list[tuple[float, int]] = []
        self._since: dict[Request, float] = {}    # released, not yet handed back -> its arrival

    def arrived(self, r: Request) -> None:
        self._since[r] = r.arrival_time
        self.changes.append((r.arrival_time, 1))

    def left(self, r: Request, now: float) -> None:
        since = self._since.pop(r, None)
        if since is None:                         # never released by a driver: not counted
            return
        if r.status is Status.FINISHED and r.token_times:
            self.changes.append((min(max(r.token_times[-1], since), now), -1))
        else:
            self.changes.append((since, -1))

    def rebased(self, t0: float) -> list[tuple[float, int]]:
        """The changes in seconds from the point's start (as run/point.py rebases the stamps)."""
        return [(t - t0, d) for t, d in self.changes]

    def counting(self, on_done: Callback, clock: Clock) -> Callback:
        """`on_done`, after taking the request out of the count."""
        def done(r: Request) -> None:
            self.left(r, clock.now())
            on_done(r)
        return done


class Inbox:
    """Where requests come from: a planned trace and/or live submissions. A planned request is
    handed to the scheduler `delay_s` after its arrival (an engine's front end, EngineFacts
    arrival_delay_s), though it counts from its arrival: its stamps are never shifted."""

    def __init__(self, planned: Iterable[Request] = (), live: bool = False, flush_idle_s: float | None = None,
                 delay_s: float = 0.0, engine_s: float = 0.0, engine_s_per_token: float = 0.0):
        self.delay_s = delay_s
        self.planned = deque(sorted(planned, key=lambda r: (r.arrival_time, r.index)))
        # A front end on the engine's processor (engine_s per request, engine_s_per_token per
        # prompt token besides) takes planned requests one after another: each is handed over when
        # the front end is done with it, and the engine owes the front end's time (`owed`, charged
        # by the driver to the engine's next step).
        self.engine_s, self.per_token, self.owed = engine_s, engine_s_per_token, 0.0
        self.serial = bool(engine_s or engine_s_per_token)
        self.due: deque[float] = deque(_serial(self.planned, self.front_s)) if self.serial else deque()
        self.waiting: list[tuple[float, int, Request]] = []   # past that front end, waiting delay_s more: a heap
        self.later: list[tuple[float, int, Request]] = []   # planned while running (session turns): a heap
        self.live: deque[Request] = deque()
        self.open = live                   # live submissions may still come
        self.event = asyncio.Event()
        self.cancelled: list[Request] = []  # clients gone; dropped between steps/batches (see drive)
        self.flush_idle_s = flush_idle_s   # live: no arrivals this long counts as draining (None: never)
        self.quiet = False                 # live: nothing is on its way until something runs (see draining)
        self.last_arrival = float("-inf")

    def push(self, request: Request) -> None:
        self.last_arrival = max(self.last_arrival, request.arrival_time)
        self.live.append(request)
        self.event.set()

    def close(self) -> None:
        self.open = False
        self.event.set()

    def cancel(self, request: Request) -> None:
        """A live client went away. NOTE: honoured only between steps and batches, never inside
        one: a row of a running request-level batch is dropped when its batch ends."""
        self.cancelled.append(request)
        self.event.set()

    def plan(self, request: Request) -> None:
        """A request planned while the run goes on (a session's next turn): released at its
        arrival time, in the trace's order (arrival, then index), exactly like a trace's."""
        heapq.heappush(self.later, (request.arrival_time, request.index, request))

    @property
    def exhausted(self) -> bool:
        return not self.planned and not self.later and not self.live and not self.waiting and not self.open

    @property
    def next_arrival(self) -> float | None:
        """When the next planned request is handed over (its arrival plus the front end's delay)."""
        if self.serial:
            times = [t for t in (self.due[0] if self.due else None,
                                 self.later[0][0] + self.front_s(self.later[0][2]) if self.later else None,
                                 self.waiting[0][0] if self.waiting else None) if t is not None]
            return min(times) if times else None
        nxt = self.planned[0].arrival_time if self.planned else None
        if self.later and (nxt is None or self.later[0][0] < nxt):
            nxt = self.later[0][0]
        return None if nxt is None else nxt + self.delay_s

    @property
    def paused_at(self) -> float | None:
        """When a live inbox's traffic counts as paused (see the module docstring); None: never."""
        return None if self.flush_idle_s is None else self.last_arrival + self.flush_idle_s

    def draining(self, now: float) -> bool:
        """No more requests will come, or (live, with flush_idle_s) none came for a while, or
        (`quiet`, set by whoever feeds a live inbox: replicas running sessions) none will come
        unless a request now waiting runs and answers: naive batching must not wait for a full batch."""
        if not (self.planned or self.later or self.live or self.waiting or self.open):   # exhausted, inlined: every step asks
            return True
        return self.quiet or (self.flush_idle_s is not None and now >= self.last_arrival + self.flush_idle_s)

    def release(self, now: float, scheduler: Scheduler, occupancy: Occupancy | None = None,
                idle_from: float | None = None) -> None:
        """Hand the scheduler every request due by `now`. `idle_from`: when the engine went idle,
        if it has been idle since (a front end on its processor then ran for free)."""
        # NOTE: due when arrival + delay <= now, the sum `next_arrival` wakes the loop at: testing
        # arrival <= now - delay instead can miss by one ulp, and the loop then wakes forever
        if self.serial:
            return self._release_serial(now, scheduler, occupancy, idle_from)
        d = self.delay_s
        while self.later and self.later[0][0] + d <= now:  # merged with the trace by (arrival, index)
            if self.planned and (self.planned[0].arrival_time, self.planned[0].index) < self.later[0][:2]:
                self._hand(self.planned.popleft(), scheduler, occupancy, now)
            else:
                self._hand(heapq.heappop(self.later)[2], scheduler, occupancy, now)
        while self.planned and self.planned[0].arrival_time + d <= now:
            self._hand(self.planned.popleft(), scheduler, occupancy, now)
        while self.live:
            self._hand(self.live.popleft(), scheduler, occupancy, now)

    def _release_serial(self, now: float, scheduler: Scheduler, occupancy: Occupancy | None,
                        idle_from: float | None) -> None:
        """release() behind a front end on the engine's processor: planned requests when the front
        end is done with them (`due`); a session's later turn its front end's time after its
        arrival (it is not queued behind the trace: a simplification, turns being few). The engine owes the part
        of each front end's work done while it was busy; none of what fell in its idle time. A
        delay_s besides (off the engine) holds each request that much longer after its front end:
        what is owed is settled when the front end is done (the loop wakes then), not at hand-over."""
        x = self.delay_s
        busy_until = now if idle_from is None else idle_from
        while self.planned and self.due[0] <= now:
            done, r = self.due.popleft(), self.planned.popleft()
            d = self.front_s(r)
            self.owed += min(d, max(0.0, busy_until - (done - d)))
            heapq.heappush(self.waiting, (done + x, r.index, r))
        while self.later and self.later[0][0] + self.front_s(self.later[0][2]) <= now:
            at, i, r = heapq.heappop(self.later)
            d = self.front_s(r)
            self.owed += min(d, max(0.0, busy_until - at))
            heapq.heappush(self.waiting, (at + d + x, i, r))
        while self.waiting and self.waiting[0][0] <= now:
            self._hand(heapq.heappop(self.waiting)[2], scheduler, occupancy, now)
        while self.live:
            self._hand(self.live.popleft(), scheduler, occupancy, now)

    def front_s(self, r: Request) -> float:
        """The engine time request r's front end takes."""
        return self.engine_s + self.per_token * r.prompt_len

    @staticmethod
    def _hand(r: Request, scheduler: Scheduler, occupancy: Occupancy | None, now: float) -> None:
        r.handed_time = now
        if occupancy is not None:
            occupancy.arrived(r)
        scheduler.add(r)


def _serial(planned: Iterable[Request], front_s: Callable[[Request], float]) -> list[float]:
    """When a front end that takes front_s(r) of each request, one at a time, is done with each
    of the planned requests (in their order): the later of its arrival and the previous one's
    end, plus its own time."""
    done, out = float("-inf"), []
    for r in planned:
        done = max(r.arrival_time, done) + front_s(r)
        out.append(done)
    return out


def given(cfg: RunConfig, facts: EngineFacts, live: bool, sessions: bool = False) -> Given:
    """What a scheduler is given by the run: the engine's memory, and decode windows only where
    the engine runs them and every arrival is known in advance (not live traffic); a window may
    run past a finish only where nobody acts on one before it ends (no session's next turn)."""
    windows = facts.decode_windows and not live
    return Given(facts.memory, facts.num_kv_blocks(cfg.continuous.block_size), windows,
                 finish_in_window=windows and not sessions)


async def drive(scheduler: Scheduler, backend: Engine, clock: Clock, inbox: Inbox,
                on_done: Callback = lambda r: None, on_progress: Progress | None = None,
                on_launch: Callable[[int], None] | None = None, occupancy: Occupancy | None = None,
                next_turn: NextTurn | None = None) -> None:
    """Run until the inbox is exhausted and every request is finished or failed.
    `on_done` gets every request that finished or failed; `on_progress` requests that got new
    tokens (a server streams them); `on_launch` the size of every batch or step launched;
    `occupancy` every arrival and departure (see Occupancy); `next_turn` every request handed
    back, and returns the request it makes the inbox expect next, if any (sessions)."""
    if occupancy is not None:
        on_done = occupancy.counting(on_done, clock)
    if next_turn is not None:
        on_done = _continuing(on_done, next_turn, inbox)
    idle_since = clock.now()
    idle_from: float | None = idle_since      # when the engine went idle, while it is (None: it ran since)
    stalled: dict[Request, tuple[float, int]] = {}   # preempted -> (when, tokens it had)
    while True:
        now = clock.now()
        inbox.release(now, scheduler, occupancy, idle_from)
        if inbox.owed:                         # a front end on the engine's processor took this much of it
            backend.front_end(inbox.owed)
            inbox.owed = 0.0
        if inbox.cancelled:                    # NOTE: hot loop (every step): call only when needed
            _drop_cancelled(scheduler, backend, inbox, on_done)
        out = scheduler.schedule(now, draining=inbox.draining(now))
        if scheduler.rejected:
            _drain_rejected(scheduler, backend, on_done)
        if isinstance(out, Batch):
            charge_launch(out.requests, now, idle_since)
            if on_launch is not None:
                on_launch(len(out.requests))
            await _run_batch(scheduler, backend, clock, out, on_done, on_progress)
            idle_since, idle_from = clock.now(), None
        elif isinstance(out, Step):
            if out.repeat > 1:
                _bound_window(out, scheduler, inbox)
            if on_launch is not None:
                on_launch(len(out.chunks))
            await _run_step(scheduler, backend, clock, out, on_done, on_progress, stalled)
            idle_from = None
        else:
            if inbox.exhausted and not scheduler.has_work():
                return
            idle_from = now if idle_from is None else idle_from
            await _idle(clock, inbox, now, _until_paused(out, scheduler, inbox, now))


def _continuing(on_done: Callback, next_turn: NextTurn, inbox: Inbox) -> Callback:
    """`on_done`, then plan the turn that the request's answer lets its session send.
    NOTE: called inside the step or batch that finished it, so the turn is planned before the
    loop next looks at the inbox (draining, a decode window's bound, the end of the run)."""
    def done(r: Request) -> None:
        on_done(r)
        nxt = next_turn(r)
        if nxt is not None:
            inbox.plan(nxt)
    return done


def _until_paused(idle: Idle, scheduler: Scheduler, inbox: Inbox, now: float) -> float | None:
    """A live inbox's pause turns waiting requests into a drain: wake up for it."""
    paused = inbox.paused_at
    if paused is None or not scheduler.waiting or now >= paused:
        return idle.wake_at
    return paused if idle.wake_at is None else min(idle.wake_at, paused)


async def _idle(clock: Clock, inbox: Inbox, now: float, wake_at: float | None) -> None:
    nxt = inbox.next_arrival
    wake = min((t for t in (wake_at, nxt) if t is not None), default=None)
    if not inbox.open:
        if wake is None:
            raise RuntimeError("scheduler is stuck: requests are waiting but nothing can run")
        await clock.sleep_until(wake)          # exactly: a deadline must not land 1 ulp early
        return
    inbox.event.clear()
    if not inbox.live and not inbox.cancelled:
        await clock.wait(inbox.event, None if wake is None else wake - now)


def _bound_window(step: Step, scheduler: Scheduler, inbox: Inbox) -> None:
    """A decode window must end at the step in flight when the next request arrives (it might
    be admitted then) unless someone is already waiting ahead of it (FCFS: it cannot be). A
    front end on the engine's processor ends it there all the same: from that step on the
    engine owes the front end's time, whether the request is admitted or queues."""
    if not scheduler.waiting or inbox.serial:
        step.until = inbox.next_arrival


async def _run_batch(scheduler: Scheduler, backend: Engine, clock: Clock, batch: Batch, on_done: Callback,
                     on_progress: Progress | None) -> None:
    watch = asyncio.ensure_future(_watch(batch.requests, clock, on_progress)) if on_progress else None
    try:
        await backend.run_batch(batch.requests, clock)
    except OutOfMemory as e:   # the backend's message says why (sizes, budget): keep it
        scheduler.finish_batch(batch, clock.now(), oom=f"out of memory — {e}" if str(e) else True)
        _drain_rejected(scheduler, backend, on_done)
        return
    except (Exception, SystemExit) as e:  # a failed (or exiting) batch fails its requests, not the run
        for r in batch.requests:
            r.fail(f"{type(e).__name__}: {e}")
    finally:
        if watch is not None:
            watch.cancel()
    scheduler.finish_batch(batch, clock.now())
    for r in batch.requests:
        if r.status is not Status.FAILED:
            finish(r)
        on_done(r)


async def _watch(requests: list[Request], clock: Clock, on_progress: Progress) -> None:
    """While a request-level batch runs, report rows that got new tokens (so a server streams)."""
    seen = {r: r.output_len for r in requests}
    while True:
        await clock.sleep(POLL_S)
        moved = [r for r in requests if r.output_len != seen[r] and r.status is Status.RUNNING]
        if moved:
            for r in moved:
                seen[r] = r.output_len
            on_progress(moved)


async def _run_step(scheduler: Scheduler, backend: Engine, clock: Clock, step: Step, on_done: Callback,
                    on_progress: Progress | None, stalled: dict) -> None:
    for r in step.preempted:
        backend.release(r)
    try:
        step.ran = await backend.step(step, clock)
    except (Exception, SystemExit) as e:     # a failed (or exiting) step fails its requests, not the run
        for r, _ in step.chunks:
            scheduler.abort(r)
            backend.release(r)
            r.fail(f"{type(e).__name__}: {e}")
            on_done(r)
        return
    if stalled or step.preempted:              # NOTE: rare; skip the call on every other step
        _charge_preemptions(stalled, step, clock.now())
    if on_progress is not None:
        on_progress([r for r, _ in step.chunks])
    for r in scheduler.finish_step(step, clock.now()):
        backend.release(r)
        finish(r, queued_as="wait_capacity")
        on_done(r)


def _charge_preemptions(stalled: dict, step: Step, end: float) -> None:
    """A preempted request would have had its next token at the end of the step that evicted it;
    everything from then until its next token (requeue, recompute) is a stall caused by others.
    NOTE: that next token is token_times[had], not the last one: a decode window (Step.repeat > 1)
    stamps several tokens after the recompute in one call."""
    for r in step.preempted:
        stalled.setdefault(r, (end, r.output_len))
    for r, _ in step.chunks:
        if r in stalled and r.output_len > stalled[r][1]:
            since, had = stalled.pop(r)
            charge_stall(r, r.token_times[had] - since, before_first_token=had == 0)


def _drop_cancelled(scheduler: Scheduler, backend: Engine, inbox: Inbox, on_done: Callback) -> None:
    """Free waiting or running (iteration-level) requests whose clients went away."""
    while inbox.cancelled:
        r = inbox.cancelled.pop(0)
        if r.is_done or not scheduler.abort(r):
            continue
        backend.release(r)
        r.fail("cancelled: the client disconnected")
        on_done(r)


def _drain_rejected(scheduler: Scheduler, backend: Engine, on_done: Callback) -> None:
    """Hand back what the scheduler failed; one that had run (a policy that broke its contract
    fails its running requests too) gives its KV back to the backend."""
    while scheduler.rejected:
        r = scheduler.rejected.pop(0)
        backend.release(r)
        on_done(r)
