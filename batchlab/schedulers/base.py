"""The scheduler interface: pure bookkeeping over waiting and running requests.

A scheduler never touches a model, a socket, a file or a clock: the driver (run/driver.py)
passes `now` in and executes what `schedule()` returns:
  - `Batch`: request-level; the backend runs these requests to completion, then the driver
    calls `finish_batch()` (with `oom` set if the batch did not fit in memory: True, or the
    reason to record on requests that fail for it);
  - `Step`: iteration-level; the backend runs one forward pass over `chunks`, then the driver
    calls `finish_step()`;
  - `Idle`: nothing to do until `wake_at` (or until a request arrives, if None).
The same object therefore runs unchanged in virtual time and in real time.
A scheduler class describes itself: its strategy name, level, options model (its own config
section, named after it), the sections it runs under, the knob that caps a batch's rows, and how
reports name and draw it; schedulers/__init__.py registers it with one line.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from batchlab.core.config import Model, RunConfig
from batchlab.core.request import Request, Status
from batchlab.core.work import Batch, Idle, MemoryBudget, Step


@dataclass(frozen=True)
class Given:
    """What a run gives a scheduler besides its config: the backend's memory, and whether it may
    offer decode windows (schedulers/decode_window.py)."""
    memory: MemoryBudget | None = None   # the backend's KV memory, for padded request-level batches
    num_kv_blocks: int | None = None     # the backend's KV capacity in blocks, when the config sets none
    windows: bool = False                # may offer decode windows: the engine runs them and every arrival is known
    finish_in_window: bool = False       # a window may run past a finish: nobody acts on one before it ends


class Scheduler(ABC):
    """Contract: `add()` takes an arrived request; `schedule(now, draining)` says what to run;
    every request handed out in a Batch or Step is later passed back through `finish_batch()`
    or `finish_step()`. `draining` means no more requests will arrive."""

    name: ClassVar[str]               # the strategy name (a policy of your own: its import path)
    level: ClassVar[str]              # "request" or "iteration"
    options_model: ClassVar[type[Model] | None] = None   # its own config section's model, the section named `name`
    runs_under: ClassVar[tuple[str, ...]] = ()     # other sections whose settings shape its runs (a policy's budgets)
    cap: ClassVar[str] = ""           # the dotted knob that caps the rows of one batch or step
    title: ClassVar[str] = ""         # how a report names it at the start of a sentence ("Naive batching ...")
    short: ClassVar[str] = ""         # how a sentence opens with it when shorter than the title ("SJF cut ...")
    color: ClassVar[str | None] = None   # its colour in every plot (None: one picked from its name)
    compared_with: ClassVar[str | None] = None   # a policy: the strategy reports pair it with

    def __init__(self) -> None:
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.rejected: list[Request] = []     # failed by the scheduler (can never fit); driver drains it

    @classmethod
    def from_config(cls, cfg: RunConfig, given: Given) -> Scheduler:
        """Build from a run's config and what the run gives it (`Given`). A policy of your own
        overrides this to read its settings."""
        return cls()

    @classmethod
    def sections(cls) -> tuple[str, ...]:
        """The config sections whose settings shape this strategy's runs (its CSV `knobs`)."""
        return cls.runs_under + ((cls.name,) if cls.options_model is not None else ())

    @classmethod
    def batch_rows(cls, cfg: Any) -> int:
        """The most requests one batch (or step) holds under `cfg`: what a burst is sized by."""
        section, _, key = cls.cap.partition(".")
        return getattr(getattr(cfg, section), key)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def cached_tokens(self, request: Request) -> int:
        """Prompt tokens of `request` this scheduler's prefix cache holds now (0 without one);
        a look that changes nothing, for a cache-aware router."""
        return 0

    def abort(self, request: Request) -> bool:
        """Forget a request that is still waiting (a client went away). True if it was removed."""
        try:
            self.waiting.remove(request)
        except ValueError:
            return False
        return True

    @abstractmethod
    def schedule(self, now: float, draining: bool = False) -> Batch | Step | Idle: ...

    def finish_batch(self, batch: Batch, now: float, oom: bool | str = False) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not run request-level batches")

    def finish_step(self, step: Step, now: float) -> list[Request]:
        """Take back a step the backend ran (`step.ran` steps of it: more than one only for a
        decode window); returns the requests that have all their tokens."""
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

    def finish_batch(self, batch: Batch, now: float, oom: bool | str = False) -> None:
        """Naive batching has no back-off: an out-of-memory batch fails (and is recorded), with
        the reason when `oom` carries one (the backend's message: what did not fit, and why)."""
        self.running = []
        if oom:
            reason = oom if isinstance(oom, str) else "out of memory"
            for r in batch.requests:
                r.fail(reason)
            self.rejected.extend(batch.requests)

    def requeue(self, batch: Batch) -> None:
        """Put a batch back at the front, in its original order: nothing is lost."""
        for r in reversed(batch.requests):
            r.status = Status.QUEUED
            r.token_times.clear()
            r.output_token_ids.clear()
            self.waiting.appendleft(r)
