"""The driver: the one loop that connects a scheduler, a backend and a clock.

It releases arrived requests into the scheduler, asks it what to run, runs that on the backend
and reports back. Arrivals are released at their *planned* times (the trace says when a user
sent them), so a request that arrives while a batch runs is stamped correctly even though the
scheduler only sees it afterwards. Live requests (the HTTP server) are pushed in with their
arrival already stamped. Failed requests keep their status and error and are reported too.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable, Iterable

from batchlab.backends.base import Backend, OutOfMemory
from batchlab.core.clock import Clock
from batchlab.core.request import Request, Status
from batchlab.schedulers.base import Batch, Scheduler, Step

Callback = Callable[[Request], None]


class Inbox:
    """Where requests come from: a planned trace and/or live submissions."""

    def __init__(self, planned: Iterable[Request] = (), live: bool = False):
        self.planned = deque(sorted(planned, key=lambda r: (r.arrival_time, r.index)))
        self.live: deque[Request] = deque()
        self.open = live                   # live submissions may still come
        self.event = asyncio.Event()
        self.cancelled: list[Request] = []  # clients gone; dropped between steps/batches (see drive)

    def push(self, request: Request) -> None:
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

    @property
    def exhausted(self) -> bool:
        return not self.planned and not self.live and not self.open

    @property
    def next_arrival(self) -> float | None:
        return self.planned[0].arrival_time if self.planned else None

    def release(self, now: float, scheduler: Scheduler) -> None:
        while self.planned and self.planned[0].arrival_time <= now:
            scheduler.add(self.planned.popleft())
        while self.live:
            scheduler.add(self.live.popleft())


async def drive(scheduler: Scheduler, backend: Backend, clock: Clock, inbox: Inbox,
                on_done: Callback = lambda r: None, on_progress: Callable[[list[Request]], None] | None = None) -> None:
    """Run until the inbox is exhausted and every request is finished or failed."""
    idle_since = clock.now()
    stalled: dict[Request, tuple[float, int]] = {}   # preempted -> (when, tokens it had)
    # Decode windows only where every arrival is known in advance and the backend runs them.
    scheduler.multi_step = getattr(backend, "multi_step", False) and not inbox.open
    while True:
        now = clock.now()
        inbox.release(now, scheduler)
        _drop_cancelled(scheduler, backend, inbox, on_done)
        out = scheduler.schedule(now, draining=inbox.exhausted)
        _drain_rejected(scheduler, on_done)
        if isinstance(out, Batch):
            _account_queue(out.requests, now, idle_since)
            await _run_batch(scheduler, backend, clock, out, on_done)
            idle_since = clock.now()
        elif isinstance(out, Step):
            _bound_window(out, scheduler, inbox)
            await _run_step(scheduler, backend, clock, out, on_done, on_progress, stalled)
        else:
            if inbox.exhausted and not scheduler.has_work():
                return
            await _idle(clock, inbox, now, out.wake_at)


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
    be admitted then) unless someone is already waiting ahead of it (FCFS: it cannot be)."""
    if step.repeat > 1 and not scheduler.waiting:
        step.until = inbox.next_arrival


def _account_queue(batch: list[Request], now: float, idle_since: float) -> None:
    """Split each request's queue time: while the backend was busy vs waiting for a trigger."""
    for r in batch:
        r.add_time("wait_busy", min(now, idle_since) - r.arrival_time)
        r.add_time("wait_trigger", now - max(r.arrival_time, idle_since))


async def _run_batch(scheduler: Scheduler, backend, clock: Clock, batch: Batch, on_done: Callback) -> None:
    try:
        await backend.run_batch(batch.requests, clock)
    except OutOfMemory:
        scheduler.finish_batch(batch, clock.now(), oom=True)
        _drain_rejected(scheduler, on_done)
        return
    except Exception as e:  # a failed batch fails its requests, not the run
        for r in batch.requests:
            r.fail(f"{type(e).__name__}: {e}")
    scheduler.finish_batch(batch, clock.now())
    for r in batch.requests:
        if r.status is not Status.FAILED:
            _finish(r)
        on_done(r)


async def _run_step(scheduler: Scheduler, backend, clock: Clock, step: Step, on_done: Callback, on_progress,
                    stalled: dict) -> None:
    for r in step.preempted:
        backend.release(r)
    try:
        await backend.step(step, clock)
    except Exception as e:
        for r, _ in step.chunks:
            scheduler.abort(r)
            backend.release(r)
            r.fail(f"{type(e).__name__}: {e}")
            on_done(r)
        return
    _charge_preemptions(stalled, step, clock.now())
    if on_progress is not None:
        on_progress([r for r, _ in step.chunks])
    for r in scheduler.finish_step(step, clock.now()):
        backend.release(r)
        r.add_time("wait_capacity", r.scheduled_time - r.arrival_time)
        _finish(r)
        on_done(r)


def _charge_preemptions(stalled: dict, step: Step, end: float) -> None:
    """A preempted request would have had its next token at the end of the step that evicted it;
    everything from then until its next token (requeue, recompute) is a stall caused by others."""
    for r in step.preempted:
        stalled.setdefault(r, (end, r.output_len))
    if not stalled:                            # the common case: skip the per-row loop
        return
    for r, _ in step.chunks:
        if r in stalled and r.output_len > stalled[r][1]:
            since, had = stalled.pop(r)
            r.add_time("stall", r.token_times[-1] - since)
            if had == 0:
                r.add_time("stall_prefill", r.token_times[-1] - since)


def _finish(r: Request) -> None:
    if r.output_len != r.max_new_tokens:
        r.fail(f"backend produced {r.output_len} tokens, expected {r.max_new_tokens}")
        return
    r.status = Status.FINISHED
    first = r.token_times[0]
    # NOTE: stalls (backend or preemption) are reported apart, so the phases still sum to E2E.
    stall_prefill = r.breakdown.pop("stall_prefill", 0.0)
    r.add_time("prefill", first - r.scheduled_time - stall_prefill)
    r.add_time("decode", r.token_times[-1] - first - (r.breakdown.get("stall", 0.0) - stall_prefill))


def _drop_cancelled(scheduler: Scheduler, backend, inbox: Inbox, on_done: Callback) -> None:
    """Free waiting or running (iteration-level) requests whose clients went away."""
    while inbox.cancelled:
        r = inbox.cancelled.pop(0)
        if r.is_done or not scheduler.abort(r):
            continue
        if hasattr(backend, "release"):
            backend.release(r)
        r.fail("cancelled: the client disconnected")
        on_done(r)


def _drain_rejected(scheduler: Scheduler, on_done: Callback) -> None:
    while scheduler.rejected:
        on_done(scheduler.rejected.pop(0))
