"""A third-party policy held to the scheduler contract (schedulers/base.py).

The contract: `schedule()` returns a Step, Batch or Idle; a Step's rows are distinct running
requests that still have tokens to compute, at most `max_num_seqs` of them and, if more than one,
at most `max_num_batched_tokens` tokens; a Batch holds distinct waiting requests; every request
added stays in `waiting` or `running` until it is handed back (finished, in `rejected`, aborted);
nothing raises. A policy that breaks it is stopped where it broke: every request it still holds
fails with an error naming the policy and the breach, later arrivals fail the same way, and the
run goes on, so nothing is lost and the report says what happened.
"""
from __future__ import annotations

from batchlab.core.config import one_line
from batchlab.core.limits import MAX_BATCH
from batchlab.core.request import Request
from batchlab.core.work import Batch, Idle, Step
from batchlab.schedulers.base import Scheduler
from batchlab.schedulers.continuous import ContinuousConfig


class Guarded(Scheduler):
    def __init__(self, inner: Scheduler, name: str, budgets: ContinuousConfig):
        super().__init__()
        self.inner, self.name, self.budgets = inner, name, budgets
        self.level = inner.level
        self.broken: str | None = None
        self.held: set[Request] = set()        # added and not yet handed back

    # What the driver and routers read, from the policy itself.
    waiting = property(lambda self: self.inner.waiting, lambda self, v: None)
    running = property(lambda self: self.inner.running, lambda self, v: None)

    def __getattr__(self, name: str):
        # NOTE: only for what this class does not define: read-only facts a caller may look at
        # (free_blocks, num_kv_blocks, a policy's own counters), from the policy itself.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def add(self, request: Request) -> None:
        if self.broken:
            request.fail(self.broken)
            self.rejected.append(request)
            return
        self.held.add(request)
        self._call(self.inner.add, request)

    def has_work(self) -> bool:
        return bool(self.held) and self.broken is None

    def cached_tokens(self, request: Request) -> int:
        return 0 if self.broken else self._call(self.inner.cached_tokens, request) or 0

    def abort(self, request: Request) -> bool:
        gone = not self.broken and bool(self._call(self.inner.abort, request))
        if gone:
            self.held.discard(request)
        return gone

    def schedule(self, now: float, draining: bool = False) -> Batch | Step | Idle:
        if self.broken:
            return Idle()
        out = self._call(self.inner.schedule, now, draining)
        self._hand_back(self.inner.rejected)
        problem = self.broken or _breach(out, self.held, self.inner, self.budgets)
        if problem:
            self._break(problem)
            return Idle()
        return out

    def finish_step(self, step: Step, now: float) -> list[Request]:
        done = self._call(self.inner.finish_step, step, now)
        return self._finished(done, [r for r, _ in step.chunks])

    def finish_batch(self, batch: Batch, now: float, oom: bool | str = False) -> None:
        self._call(self.inner.finish_batch, batch, now, oom)
        requeued = set(self.inner.waiting) if not self.broken else set()
        self._held_check([r for r in batch.requests if r not in requeued])   # the driver finishes the rest

    def _finished(self, done, ran: list[Request]) -> list[Request]:
        if self.broken:
            return []
        if not isinstance(done, list) or any(r not in ran or r.output_len < r.max_new_tokens for r in done):
            self._break("finish_step() handed back a request that was not in the step or is not finished")
            return []
        self._held_check(done)                 # may stop the policy: what it still holds fails
        return done                            # these did finish: the driver hands them back

    def _held_check(self, done: list[Request]) -> bool:
        """Forget what was handed back; the rest must still be waiting or running."""
        if self.broken:
            return False
        self.held.difference_update(done)
        self._hand_back(self.inner.rejected)
        if len(self.inner.waiting) + len(self.inner.running) != len(self.held):
            kept = set(self.inner.waiting) | set(self.inner.running)
            lost = [r for r in self.held if r not in kept]
            if lost:
                self._break(f"lost {len(lost)} request(s) (neither waiting, running nor handed back)")
                return False
        return True

    def _hand_back(self, rejected: list[Request]) -> None:
        while rejected:
            r = rejected.pop(0)
            self.held.discard(r)
            self.rejected.append(r)

    def _call(self, fn, *args):
        if self.broken:
            return None
        try:
            return fn(*args)
        except (Exception, SystemExit) as e:   # the policy's own bug (or its exit): fail its requests, not the run
            self._break(f"{fn.__name__}() raised {type(e).__name__}: {one_line(str(e))}")
            return None

    def _break(self, reason: str) -> None:
        self.broken = f"policy '{self.name}' broke the scheduler contract: {reason}"
        for r in sorted(self.held, key=lambda r: r.index):
            r.fail(self.broken)
            self.rejected.append(r)
        self.held.clear()


def _breach(out, held: set[Request], inner: Scheduler, budgets: ContinuousConfig) -> str | None:
    """What is wrong with what schedule() returned, or None."""
    if isinstance(out, Idle):
        return None
    if isinstance(out, Step):
        rows = [r for r, _ in out.chunks]
        running = set(inner.running)
        if len(rows) > budgets.max_num_seqs:
            return f"schedule() returned a step of {len(rows)} rows; continuous.max_num_seqs is {budgets.max_num_seqs}"
        if len(rows) > 1 and out.num_tokens > budgets.max_num_batched_tokens:
            return (f"schedule() returned a step of {out.num_tokens} tokens; continuous.max_num_batched_tokens "
                    f"is {budgets.max_num_batched_tokens}")
        if len(set(rows)) < len(rows):
            return "schedule() put one request in a step twice"
        for r, n in out.chunks:
            if r not in held or r not in running:
                return f"schedule() stepped request {r.request_id}, which is not one of its running requests"
            if not isinstance(n, int) or not 1 <= n <= r.num_tokens - r.num_computed_tokens:
                return (f"schedule() asked for {n!r} tokens of request {r.request_id}, which has "
                        f"{r.num_tokens - r.num_computed_tokens} to compute")
        if not out.chunks and not out.preempted:
            return "schedule() returned an empty step (return Idle() when there is nothing to run)"
        return None
    if isinstance(out, Batch):
        rows = out.requests
        if not rows or len(rows) > MAX_BATCH or len(set(rows)) < len(rows) or any(r not in held for r in rows):
            return f"schedule() returned a batch of {len(rows)} rows that are not distinct requests it holds"
        return None
    return f"schedule() returned {type(out).__name__}; expected Step, Batch or Idle"
