"""The backend contract: every member any caller uses, declared here with its promise.

Batching happens in one of two places, so there are two shapes:
- We batch (simulator, Hugging Face): the driver (run/driver.py) hands a `BatchBackend` a whole
  request-level batch (`run_batch`: padded, lockstep, to the longest output) and a `StepBackend`
  one iteration over a running set that changes every step (`step`). Both stamp every token
  through the clock they are given.
- The server batches (an OpenAI-compatible endpoint, transformers' own continuous batching): a
  `ServerBackend` receives the whole trace, sends each request at its planned arrival time and
  stamps what comes back (`run_trace`); the send loop is written once, here.
Every backend produces exactly `max_new_tokens` tokens per request (EOS ignored), so no strategy
gets shorter answers. Callers never probe a backend with getattr/hasattr: what is not declared
here is not part of the contract.
"""
from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from batchlab.core.clock import Clock
from batchlab.core.request import Request, Status
from batchlab.core.traffic import TraceItem, make_requests
from batchlab.core.work import MemoryBudget, Step

SPIN_S = 0.0015          # the last stretch before a planned send is waited by yielding, not by a 1 ms timer
FAIL_FAST_AFTER = 20     # a server run stops sending once this many first requests all failed the same way


class OutOfMemory(RuntimeError):
    """The batch did not fit in the device's memory. Dynamic batching backs off and retries."""


class Backend(ABC):
    """What the driver, a sweep point, the profiler and the server need from any backend."""

    virtual_time: ClassVar[bool] = False
    """True: runs on a VirtualClock (the simulator); False: on the RealClock."""

    levels: ClassVar[frozenset[str]] = frozenset()
    """Scheduler levels this backend executes: "request" (run_batch), "iteration" (step).
    Empty for a backend that batches for itself (a ServerBackend)."""

    runs_decode_windows: ClassVar[bool] = False
    """True if `step()` honours `Step.repeat > 1` (the step, then decode steps of every row until
    it has `max_new_tokens`, in one call; schedulers/decode_window.py) and sets `Step.repeat` to
    the steps it ran, which may be fewer than offered; the driver only lets a scheduler offer
    windows then."""

    def describe(self) -> dict[str, Any]:
        """Setup facts for reports (device, model, dtype, library versions); `model` names the
        model in every CSV row."""
        return {}

    def memory_budget(self) -> MemoryBudget | None:
        """KV budget for dynamic batching's memory trigger; None disables that trigger."""
        return None

    def num_kv_blocks(self, block_size: int) -> int | None:
        """KV capacity in blocks when the config does not set `continuous.num_kv_blocks`."""
        return None

    def tokenizer(self) -> Any | None:
        """The tokenizer a server encodes prompts and decodes outputs with; None if the backend
        has none (the simulator: prompts are counted in words, outputs are placeholders)."""
        return None

    def max_context(self) -> int | None:
        """Tokens of context (prompt + output) a request may use; None: no limit of its own."""
        return None

    def vocab_size(self) -> int | None:
        """Token ids this backend accepts: a prompt given as ids must use 0..vocab_size-1 (a server
        answers 400 otherwise). None: no vocabulary of its own (ids are not checked)."""
        return None

    def prepare(self, request: Request) -> None:
        """Called once when a request is created (e.g. tokenize it). Raise ValueError if it is
        invalid; the request is then recorded as failed with that reason and never runs."""

    async def start(self, clock: Clock) -> None:
        """Load and warm up before a measured run (called before every point; cheap when
        already loaded). Warm-up work is not part of any metric."""

    async def close(self) -> None:
        """Release resources (models, threads, connections). Safe to call more than once."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (called before each measured run)."""

    def peak_memory(self) -> dict[str, Any]:
        """{'peak_mem_bytes': int, 'peak_mem_kind': str} for the window since the last reset, or {}."""
        return {}

    def point_facts(self, measured_from: float, summary: dict[str, Any]) -> dict[str, Any]:
        """Backend-specific numbers about the point just run, for its summary row (e.g. the load
        generator's send lag, the step engine's efficiency); `measured_from` is the clock reading
        where the measured window began. {} if there are none."""
        return {}

    async def run_batch(self, requests: list[Request], clock: Clock) -> None:
        """Run a request-level batch to completion: stamp exactly `max_new_tokens` tokens on every
        request. Raise OutOfMemory if it does not fit; any other exception fails the whole batch.
        Only called when "request" is in `levels`."""
        raise NotImplementedError(f"{type(self).__name__} does not run request-level batches")

    async def step(self, step: Step, clock: Clock) -> None:
        """One forward pass over `step.chunks`: every request whose computed tokens reach its
        `num_tokens` gets one new token stamped at the step's end. Leaves `num_computed_tokens`
        to the scheduler. Only called when "iteration" is in `levels`."""
        raise NotImplementedError(f"{type(self).__name__} does not run iteration-level steps")

    def release(self, request: Request) -> None:
        """Free engine-side state (KV) of a finished, failed, cancelled or preempted request.
        A no-op for backends that keep none."""


class BatchBackend(Backend):
    """A backend that runs request-level batches (`run_batch`)."""

    levels = frozenset({"request"})

    @abstractmethod
    async def run_batch(self, requests: list[Request], clock: Clock) -> None: ...


class StepBackend(Backend):
    """A backend that runs iteration-level steps (`step`)."""

    levels = frozenset({"iteration"})

    @abstractmethod
    async def step(self, step: Step, clock: Clock) -> None: ...


class ServerBackend(Backend):
    """The server batches: requests go out at their planned arrival times, one task each, and
    come back stamped. Subclasses say how one request is sent (`send`) over what session."""

    lead_s: ClassVar[float] = 0.0
    """The first planned arrival is this far after the start, so it can be sent on time."""

    def __init__(self) -> None:
        self.send_lags: list[float] = []      # seconds between planned and actual send, last run

    async def run_trace(self, trace: list[TraceItem], clock: Clock) -> tuple[list[Request], float]:
        """Send every request of the trace at its planned time; returns the requests (failed
        ones included) and the clock reading their arrival offsets start from.
        Fails fast: once the first FAIL_FAST_AFTER requests sent have all failed the same way
        (same error once numbers are removed: a wrong model name, a refused option, a dead
        server), the rest are recorded as failed without being sent and those still in flight
        are cancelled; every failure already recorded is kept as it was."""
        self.send_lags = []
        async with self.session(len(trace)) as session:
            t0 = clock.now() + self.lead_s   # NOTE: after opening the session (a client's setup takes ms)
            requests = make_requests(trace, t0, self.prepare, self.vocab_size())
            todo = sorted((r for r in requests if not r.is_done), key=lambda r: (r.arrival_time, r.index))
            tasks: list[asyncio.Task] = []
            first, failure = todo[:FAIL_FAST_AFTER], None
            for i, r in enumerate(todo):
                await wait_until(clock, r.arrival_time)
                if first and i >= FAIL_FAST_AFTER and all(q.is_done for q in first):
                    failure, first = common_failure(first, todo[:i]), []     # decided once
                if failure:
                    break
                self.send_lags.append(clock.now() - r.arrival_time)
                tasks.append(asyncio.create_task(self.send(r, session, clock)))
            if failure:
                for task in tasks:
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=bool(failure))
            if failure:
                why = f"the first {FAIL_FAST_AFTER} requests all failed with: {failure}"
                for r in todo[len(tasks):]:
                    r.fail(f"not sent: {why}")
                for r in todo[:len(tasks)]:
                    if not r.is_done:
                        r.fail(f"cancelled in flight: {why}")
            await self.settle(session, clock)
        return requests, t0

    @abstractmethod
    def session(self, concurrency: int) -> Any:
        """An async context manager for one run (an HTTP client, a batching manager's tracker),
        sized for `concurrency` requests in flight."""

    @abstractmethod
    async def send(self, request: Request, session: Any, clock: Clock) -> None:
        """Send one request and stamp its tokens as they come back; record any failure on the
        request (status and error) and never raise."""

    async def settle(self, session: Any, clock: Clock) -> None:
        """After every send task returned: wait for results still in flight (a manager that
        streams into handlers). Default: nothing left."""


async def wait_until(clock: Clock, t: float) -> None:
    """Sleep to `t`: a timer for most of the way, then yield until due (timers are 1 ms granular)."""
    if t - clock.now() > SPIN_S:
        await clock.sleep(t - clock.now() - SPIN_S)
    while clock.now() < t:
        await clock.sleep(0)


def common_failure(first: list[Request], sent: list[Request]) -> str | None:
    """The error all of `first` (finished) failed with, numbers aside, as the first one's text;
    None if they failed differently, or if any request sent so far succeeded."""
    if not all(r.error for r in first) or any(r.status is Status.FINISHED for r in sent):
        return None
    shapes = {re.sub(r"\d+", "#", r.error) for r in first}
    return first[0].error if len(shapes) == 1 else None
