"""The two backend roles, each a small contract: every member a caller uses, with its promise.

Batching happens in one of two places, so there are two roles:
- An `Engine` is driven by batchlab: the driver (run/driver.py) hands it a whole request-level
  batch (`run_batch`: padded, lockstep, to the longest output) or one iteration over a running set
  that changes every step (`step`). It states its facts (levels, KV, vocabulary, context) in one
  `EngineFacts`. The simulator and the Hugging Face engine are engines.
- A `LoadTarget` batches for itself (an OpenAI-compatible server, transformers' own continuous
  batching): it receives the whole trace, sends each request at its planned arrival time and
  stamps what comes back (`run_trace`); the send loop is written once, here.
Both stamp every token through the clock they are given and produce exactly `max_new_tokens`
tokens per request (EOS ignored), so no strategy gets shorter answers. A backend kind's config
model (`BackendOptions`) says which role it builds, and builds it. Callers never probe a backend
with getattr/hasattr: what is not declared here is not part of the contract.
"""
from __future__ import annotations

import asyncio
import gc
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import model_validator

from batchlab.core.clock import Clock
from batchlab.core.closed_loop import ClosedLoop
from batchlab.core.config import Model, RunConfig, TrafficConfig
from batchlab.core.request import Request, Status
from batchlab.core.traffic import TraceItem, make_requests
from batchlab.core.work import MemoryBudget, Step

FAIL_FAST_AFTER = 20     # a load target stops sending once this many first requests all failed the same way
ENGINE, TARGET = "engine", "load target"      # the two roles


class OutOfMemory(RuntimeError):
    """The batch did not fit in the device's memory. Dynamic batching backs off and retries."""


@dataclass(frozen=True)
class Holds:
    """What one point holds while it runs on a cluster, so two points never share what they measure."""
    cpus: float = 1.0
    gpus: float = 0.0
    server: str | None = None      # a server's address: one point at a time is sent to it


@dataclass(frozen=True)
class Pricing:
    """What one replica costs to run: its GPUs and their price."""
    gpus_per_replica: int
    usd_per_gpu_hour: float


class BackendOptions(Model):
    """A backend kind's config section (`backend:` with its `kind`); a subclass per kind, in the
    kind's own module, registered in backends/__init__.py. It builds the backend and checks what
    the backend will read before anything is written."""
    kind: str
    role: ClassVar[str] = ENGINE
    """ENGINE or TARGET: what `build` returns."""
    reads: ClassVar[dict[str, tuple[str, ...] | None]] = {}
    """A load target: the scheduler sections (and keys, None: all) it honours; an engine reads every one."""
    extra: ClassVar[str | None] = None
    """The package extra the backend needs (pip install 'batchlab[extra]')."""
    knob_keys: ClassVar[tuple[str, ...]] = ("model", "base_url")
    """A load target: the backend keys that shape its runs, for CSV rows (the served model, and
    where it is served; an engine's runs are shaped by its strategy's sections)."""
    strategy: ClassVar[str] = "server"
    """A load target: the strategy its runs are recorded under (its own batching)."""
    title: ClassVar[str] = "Server-side"
    """A load target: how a report names its batching at the start of a sentence."""
    color: ClassVar[str] = "#CC79A7"
    """A load target: its colour in every plot."""

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError("api_key is never read from a config file or --set (it would be written to "
                             "config.yaml): export OPENAI_API_KEY, or put the key in another variable and name "
                             "that variable with backend.api_key_env")
        return data

    def build(self, cfg: RunConfig) -> Backend:
        """The backend for a run of `cfg` (heavy libraries are imported here, not at module level)."""
        raise NotImplementedError

    def preflight(self, cfg: RunConfig) -> list[str]:
        """Check what the backend will read (a model path, a server) before anything is written:
        raise ConfigError (one line) for what cannot work; return warning lines."""
        return []

    def holds(self, gpus_on_node: int, node_cpus: int) -> Holds:
        """What one of its points holds on a cluster node with these (default: one CPU)."""
        return Holds()

    def replica_count(self) -> int:
        """Engine replicas behind a router (run/replicas.py); 1: the engine alone."""
        return 1

    def pricing(self) -> Pricing | None:
        """GPUs per replica and their $ per hour, where the config states them (None: unpriced;
        summary.csv then has no cost columns)."""
        return None

    def model_names(self) -> tuple[str, ...]:
        """The names `batchlab serve` answers to for this backend's model, by default."""
        return ()

    hosts_baselines: ClassVar[bool] = False
    """Managed baselines (backends/baselines.py: vllm, transformers-serve) can run on its model."""

    def baseline(self, cfg: RunConfig, name: str, cpus: str | None) -> Backend:
        """The load target for managed baseline `name`'s points: its server on this backend's
        model, pinned to `cpus`, started and stopped around each trace (backends/managed.py)."""
        raise NotImplementedError

    def check_baselines(self, cfg: RunConfig, names: list[str]) -> list[str]:
        """Before anything is written: the baselines `names` can start here (ConfigError if not)."""
        return []

    def prepare_baselines(self, cfg: RunConfig, names: list[str], echo) -> tuple[str | None, dict[str, Any]]:
        """Before the first point: orphans stopped, cores split; the servers' cores and what setup.json records."""
        return None, {}


class Backend(ABC):
    """What both roles share: setup facts, preparing a request, start and close, per-point facts."""

    virtual_time: ClassVar[bool] = False
    """True: runs on a VirtualClock (the simulator); False: on the RealClock. A class fact: the
    clock is chosen before the backend starts."""

    def describe(self) -> dict[str, Any]:
        """Setup facts for reports (device, model, dtype, library versions); `model` names the
        model in every CSV row."""
        return {}

    def prepare(self, request: Request) -> None:
        """Called once when a request is created (e.g. tokenize it). Raise ValueError if it is
        invalid; the request is then recorded as failed with that reason and never runs."""

    async def start(self, clock: Clock) -> None:
        """Load and warm up before a measured run (called before every point; cheap when
        already loaded). Warm-up work is not part of any metric."""

    async def close(self) -> None:
        """Release resources (models, threads, connections). Safe to call more than once."""

    def point_facts(self, measured_from: float, summary: dict[str, Any]) -> dict[str, Any]:
        """Backend-specific numbers about the point just run, for its summary row (e.g. the load
        generator's send lag, the step engine's efficiency); `measured_from` is the clock reading
        where the measured window began. {} if there are none."""
        return {}

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (called before each measured run)."""

    def peak_memory(self) -> dict[str, Any]:
        """{'peak_mem_bytes': int, 'peak_mem_kind': str} for the window since the last reset, or {}
        (a remote server's memory is not this process's)."""
        return {}


@dataclass(frozen=True)
class EngineFacts:
    """What an engine offers a scheduler and a server (read after `start`)."""
    levels: frozenset[str]                 # "request" (run_batch) and/or "iteration" (step)
    decode_windows: bool = False           # step() runs Step.repeat > 1 steps in one call (schedulers/decode_window.py)
    kv_bytes_per_token: int | None = None  # 2 x layers x kv_heads x head_dim x dtype bytes
    kv_budget_bytes: int | None = None     # memory for the KV cache (None: no limit of its own)
    vocab_size: int | None = None          # a prompt given as ids must use 0..vocab_size-1 (None: unchecked)
    max_context: int | None = None         # tokens of context (prompt + output) a request may use (None: no limit)
    arrival_delay_s: float = 0.0           # seconds from a request's arrival until the engine may see it (a front end)
    frontend_engine_s: float = 0.0         # engine seconds each request's front end takes (one on the engine's cores)
    frontend_engine_s_per_token: float = 0.0   # and per prompt token besides

    @property
    def memory(self) -> MemoryBudget | None:
        """The KV budget dynamic batching's memory trigger uses; None disables that trigger."""
        if self.kv_budget_bytes is None or not self.kv_bytes_per_token:
            return None
        return MemoryBudget(self.kv_budget_bytes, self.kv_bytes_per_token)

    def num_kv_blocks(self, block_size: int) -> int | None:
        """KV capacity in blocks of `block_size` tokens, when the config sets none."""
        m = self.memory
        return None if m is None else max(1, m.budget_bytes // (block_size * m.kv_bytes_per_token))


class Engine(Backend):
    """A backend batchlab drives: request-level batches, iteration-level steps, or both."""

    @abstractmethod
    def facts(self) -> EngineFacts:
        """What this engine offers (after `start`: a model's memory is known once it is loaded)."""

    def tokenizer(self) -> Any | None:
        """The tokenizer a server encodes prompts and decodes outputs with; None if the engine
        has none (the simulator: prompts are counted in words, outputs are placeholders)."""
        return None

    async def run_batch(self, requests: list[Request], clock: Clock) -> None:
        """Run a request-level batch to completion: stamp exactly `max_new_tokens` tokens on every
        request. Raise OutOfMemory if it does not fit; any other exception fails the whole batch.
        Only called when "request" is in the facts' levels."""
        raise NotImplementedError(f"{type(self).__name__} does not run request-level batches")

    async def step(self, step: Step, clock: Clock) -> int:
        """One forward pass over `step.chunks`: every request whose computed tokens reach its
        `num_tokens` gets one new token stamped at the step's end. Leaves `num_computed_tokens`
        to the scheduler. With `step.repeat` > 1 (only if the facts say `decode_windows`), up to
        that many steps, stopping after the first that ends at or after `step.until`. Returns the
        steps run. Only called when "iteration" is in the facts' levels."""
        raise NotImplementedError(f"{type(self).__name__} does not run iteration-level steps")

    def release(self, request: Request) -> None:
        """Free engine-side state (KV) of a finished, failed, cancelled or preempted request.
        A no-op for engines that keep none."""

    def front_end(self, seconds: float) -> None:
        """Front-end work that took the engine's processor (facts' frontend_engine_s per request):
        a simulated engine charges it to its next step; a real one has lived it already."""


class LoadTarget(Backend):
    """The target batches for itself: requests go out at their planned arrival times, one task
    each, and come back stamped. Subclasses say how one request is sent (`send`) over what session."""

    lead_s: ClassVar[float] = 0.0
    """The first planned arrival is this far after the start, so it can be sent on time."""

    def __init__(self) -> None:
        self.send_lags: list[float] = []      # seconds between planned and actual send, last run
        self.split_facts: dict[str, Any] = {}  # the last run's load generator processes, if it had several

    async def run_trace(self, trace: list[TraceItem], clock: Clock, traffic: TrafficConfig | None = None,
                        per_user: int | None = None, t0: float | None = None, indices: list[int] | None = None,
                        workers: int = 1, spread: str = "local") -> tuple[list[Request], float]:
        """Send every request of the trace at its planned time; returns the requests (failed
        ones included) and the clock reading their arrival offsets start from.
        A closed-loop trace (its items name their users) with the `traffic` that made it: each
        user's next request is sent when its previous answer ends (core/closed_loop.py), the
        planned time being the last token's stamp, so the send lag is measured as for any arrival;
        `per_user`: each user stops after that many requests (unset: at the traffic's end).
        Fails fast: once the first FAIL_FAST_AFTER requests sent have all failed the same way
        (same error once numbers are removed: a wrong model name, a refused option, a dead
        server), the rest are recorded as failed without being sent and those still in flight
        are cancelled; every failure already recorded is kept as it was.
        `workers` > 1: the trace is sent by that many processes, or Ray actors where `spread` is
        ray (backends/split.py; open loop only). A worker sends its share with `t0`, the start
        the parent chose, and `indices`, its items' places in the whole trace."""
        self.send_lags, self.split_facts = [], {}
        # NOTE: a full collection of a large heap stops the loop for milliseconds, and every send
        # planned meanwhile leaves late: what exists before the run is set aside from the collector
        # (no collection first: garbage among it is only collected after the run, once unfrozen)
        gc.freeze()
        try:
            return await self._run_trace(trace, clock, traffic, per_user, t0, indices, workers, spread)
        finally:
            gc.unfreeze()

    async def _run_trace(self, trace, clock, traffic, per_user, t0, indices, workers, spread) -> tuple[list[Request], float]:
        if workers > 1:
            from batchlab.backends.split import run_split
            requests, t0, self.split_facts = await run_split(self, trace, clock, traffic, workers, spread)
            return requests, t0
        async with self.session(len(trace)) as session:
            # NOTE: the requests are built before the start is fixed (preparing 10,000 prompts takes
            # a fifth of a second here: the first ones would leave late), after opening the session
            requests = make_requests(trace, 0.0, self.prepare, self.vocab_size(), indices)
            if t0 is None:
                t0 = clock.now() + self.lead_s
            for r in requests:
                r.arrival_time += t0
            users = (ClosedLoop(traffic, trace, requests, clock, t0, prepare=self.prepare, per_user=per_user)
                     if traffic is not None and trace and trace[0].user is not None else None)
            todo = sorted((r for r in requests if not r.is_done), key=lambda r: (r.arrival_time, r.index))
            tasks: list[asyncio.Task] = []
            first, failure = todo[:FAIL_FAST_AFTER], None
            for i, r in enumerate(todo):
                await clock.sleep_until(r.arrival_time)
                if first and i >= FAIL_FAST_AFTER and all(q.is_done for q in first):
                    failure, first = common_failure(first, todo[:i]), []     # decided once
                if failure:
                    break
                self.send_lags.append(clock.now() - r.arrival_time)
                send = self.send(r, session, clock) if users is None else self._user(r, users, session, clock)
                tasks.append(asyncio.create_task(send))
            if failure:
                for task in tasks:
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=bool(failure))
            if failure:
                why = f"the first {FAIL_FAST_AFTER} requests all failed with: {failure}"
                for r in todo[len(tasks):]:
                    r.fail(f"not sent: {why}")
                for r in todo[:len(tasks)] + (users.later if users else []):
                    if not r.is_done:
                        r.fail(f"cancelled in flight: {why}")
            await self.settle(session, clock)
        return (requests if users is None else users.requests()), t0

    async def _user(self, r: Request, users: ClosedLoop, session: Any, clock: Clock) -> None:
        """One closed-loop user: send, and on each answer send the next request it plans."""
        while r is not None:
            await self.send(r, session, clock)
            r = users.next_turn(r)
            if r is not None:
                await clock.sleep_until(r.arrival_time)
                self.send_lags.append(clock.now() - r.arrival_time)

    def worker_spec(self) -> tuple[type, dict[str, Any]]:
        """How a load generator process rebuilds this target: its class and keyword arguments."""
        raise NotImplementedError(f"{type(self).__name__} cannot be split across processes")

    def records(self) -> dict[str, dict]:
        """Per-request records beside the stamps (name -> request id -> value), handed back by a
        load generator process; `absorb` merges several of them. Default: none."""
        return {}

    def absorb(self, records: list[dict[str, dict]]) -> None:
        """Take over the records of several load generator processes."""

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

    def vocab_size(self) -> int | None:
        """Token ids a prompt may use (None: unknown; prompts then use ids every vocabulary has)."""
        return None

    def chunk_stamps(self, request: Request) -> list[float]:
        """When each piece of the request's answer arrived, one stamp per piece as it came (a
        server's streamed chunks): what a black-box profile reads step times from. Default: the
        token stamps (a target that hands tokens over one at a time)."""
        return list(request.token_times)


def common_failure(first: list[Request], sent: list[Request]) -> str | None:
    """The error all of `first` (finished) failed with, numbers aside, as the first one's text;
    None if they failed differently, or if any request sent so far succeeded."""
    if not all(r.error for r in first) or any(r.status is Status.FINISHED for r in sent):
        return None
    shapes = {re.sub(r"\d+", "#", r.error) for r in first}
    return first[0].error if len(shapes) == 1 else None
