"""The scheduler interface: pure bookkeeping over waiting and running requests.

A scheduler never touches a model, a socket, a file or a clock: the driver (core/driver.py)
passes `now` in and executes what `schedule()` returns:
  - `Batch`: request-level; the backend runs these requests to completion, then the driver
    calls `finish_batch()` (with `oom=True` if the batch did not fit in memory);
  - `Step`: iteration-level; the backend runs one forward pass over `chunks`, then the driver
    calls `finish_step()`;
  - `Idle`: nothing to do until `wake_at` (or until a request arrives, if None).
The same object therefore runs unchanged in virtual time and in real time.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from batchlab.core.request import Request, Status


@dataclass(slots=True)
class Batch:
    requests: list[Request]
    trigger: str                      # size | age | memory | drain


@dataclass(slots=True)
class Step:
    chunks: list[tuple[Request, int]]           # (request, tokens to compute this step)
    preempted: list[Request] = field(default_factory=list)
    # Decode window: when every chunk is a one-token decode and nothing could change the batch
    # for a while, the scheduler may offer `repeat` identical steps in a row. A backend that
    # runs them (the simulator) stops early after the first step ending at or after `until`
    # (the next arrival) and sets `repeat` to the steps it ran. Results are identical to
    # stepping one at a time; it only saves bookkeeping per step.
    repeat: int = 1
    until: float | None = None
    booked: int = 1                   # steps the scheduler booked KV blocks for (the offer)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


@dataclass(slots=True)
class Idle:
    wake_at: float | None = None      # None: nothing to do until a request arrives


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Padding-aware KV accounting for request-level batches (seed question 0.4)."""
    budget_bytes: int                 # bytes available to the KV cache
    kv_bytes_per_token: int           # 2 x layers x kv_heads x head_dim x dtype bytes

    def rows_that_fit(self, candidates: list[Request]) -> int:
        """How many candidates, oldest first, fit once padded to the longest prompt and output.
        At least 1, so one oversized request still makes progress."""
        p_max = o_max = 0
        for i, r in enumerate(candidates):
            p_max, o_max = max(p_max, r.prompt_len), max(o_max, r.max_new_tokens)
            if (i + 1) * (p_max + o_max) * self.kv_bytes_per_token > self.budget_bytes:
                return max(i, 1)
        return len(candidates)


class Scheduler(ABC):
    """Contract: `add()` takes an arrived request; `schedule(now, draining)` says what to run;
    every request handed out in a Batch or Step is later passed back through `finish_batch()`
    or `finish_step()`. `draining` means no more requests will arrive."""

    level: ClassVar[str]              # "request" or "iteration"
    multi_step: bool = False          # may offer decode windows (Step.repeat > 1); set by the driver

    def __init__(self) -> None:
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.rejected: list[Request] = []     # failed by the scheduler (can never fit); driver drains it

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request: Request) -> bool:
        """Forget a request that is still waiting (a client went away). True if it was removed."""
        try:
            self.waiting.remove(request)
        except ValueError:
            return False
        return True

    @abstractmethod
    def schedule(self, now: float, draining: bool = False) -> Batch | Step | Idle: ...

    def finish_batch(self, batch: Batch, now: float, oom: bool = False) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not run request-level batches")

    def finish_step(self, step: Step, now: float) -> list[Request]:
        raise NotImplementedError(f"{type(self).__name__} does not run iteration-level steps")


class RequestLevelScheduler(Scheduler):
    """Shared bookkeeping of naive and dynamic batching: one batch at a time, run to the end."""

    level = "request"

    def launch(self, n: int, now: float, trigger: str) -> Batch:
        batch = [self.waiting.popleft() for _ in range(n)]
        for r in batch:
            r.scheduled_time, r.status, r.trigger = now, Status.RUNNING, trigger
        self.running = batch
        return Batch(batch, trigger)

    def finish_batch(self, batch: Batch, now: float, oom: bool = False) -> None:
        """Naive batching has no back-off: an out-of-memory batch fails (and is recorded)."""
        self.running = []
        if oom:
            for r in batch.requests:
                r.fail("out of memory")
            self.rejected.extend(batch.requests)

    def requeue(self, batch: Batch) -> None:
        """Put a batch back at the front, in its original order: nothing is lost."""
        for r in reversed(batch.requests):
            r.status = Status.QUEUED
            r.token_times.clear()
            r.output_token_ids.clear()
            self.waiting.appendleft(r)
