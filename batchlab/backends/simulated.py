"""The simulated backend: charges every step by the one step-time model (backends/cost.py).

Request-level batches are charged like Hugging Face `generate()`: every row is padded to the
longest prompt, the batch decodes until its longest output is done, padded rows cost like real
ones, and a row with n tokens has its n-th token at the n-th step's stamp. Continuous steps are
charged by what they contain. In virtual time a whole batch is one jump of the clock; in real
time (the server over the simulator) it sleeps step by step so tokens stream.
"""
from __future__ import annotations

import math
import sys
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from batchlab.backends.base import BackendOptions, Engine, EngineFacts, OutOfMemory, Pricing
from batchlab.backends.cost import StepCost, attention_pairs, linear_cost, warm_weight
from batchlab.backends.presets import DEFAULT_VOCAB_SIZE, preset_kind
from batchlab.core.breakdown import charge_stall
from batchlab.core.clock import Clock, VirtualClock
from batchlab.core.config import INPUT_FILE, Model, identity_role
from batchlab.core.request import Request
from batchlab.core.work import Step


class LinearModel(Model):
    """t(b) = step_ms + b x per_seq_ms for a step with b sequences running (prompt and context
    tokens free), with no memory limit: the arithmetic of a back-of-the-envelope sizing."""
    step_ms: Annotated[float, Field(gt=0, le=1e6)]
    """Every step's fixed cost, milliseconds."""
    per_seq_ms: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    """What each running sequence adds to a step, milliseconds."""


class SimOptions(BackendOptions):
    """The simulator: every step charged by the step-time model, in virtual time."""
    kind: Literal["sim"] = "sim"
    """The simulator."""
    preset: str = "llama2-7b-a100"
    """A model and device preset: `llama2-7b-a100` (default), `mistral-7b-a100`, `mistral-7b-h200`,
    `tinyllama-3090` (roofline estimates), `toy` (a linear toy model's constants), or `<name>` for a
    measured profile saved as batchlab/data/presets/<name>.json."""
    profile: str | None = identity_role(INPUT_FILE)
    """A measured step-time profile (JSON, `batchlab profile`) instead of the preset."""
    replicas: Annotated[int, Field(gt=0, le=1024)] = 1
    """Replicas behind a router."""
    router: Literal["round_robin", "least_outstanding", "cache_aware"] = "round_robin"
    """How requests are spread over the replicas (cache_aware: the replica caching most of the
    prompt, among those with at most 8 more outstanding requests than the least loaded)."""
    linear: LinearModel | None = None
    """A linear step-time model instead of the preset or profile."""
    shape: str | None = identity_role(INPUT_FILE)
    """A model's shape for the roofline on `gpu`: its config.json, a model directory, a cached hub
    model (`org/name`), or a bundled `random:<shape>` (e.g. `random:llama3-8b`)."""
    gpu: str | None = None
    """The GPU the roofline prices `shape` on, from the catalog (e.g. `H100-SXM`, `L40S`;
    `batchlab size --list-gpus` shows them)."""
    tp: Annotated[int, Field(ge=1, le=8)] = 1
    """Tensor-parallel degree: GPUs per replica, sharing its weights and KV heads."""
    dtype: Literal["auto", "bf16", "fp16", "fp8"] = "auto"
    """Weights as served (auto: fp8 for an fp8-quantized checkpoint, else 16 bits)."""
    usd_per_gpu_hour: Annotated[float, Field(ge=0)] | None = None
    """$ per GPU-hour, for cost per token (default: the catalog's on-demand price for `gpu`)."""

    @model_validator(mode="after")
    def _one_model(self):
        if self.linear is not None and self.profile is not None:
            raise ValueError("give backend.profile or backend.linear, not both")
        if (self.shape is None) != (self.gpu is None):
            raise ValueError("backend.shape and backend.gpu go together: a model's shape priced on a GPU")
        if self.shape is not None and (self.linear is not None or self.profile is not None):
            raise ValueError("give backend.shape (with gpu), backend.profile or backend.linear, not two")
        if self.shape is None and (self.tp != 1 or self.dtype != "auto"):
            raise ValueError("backend.tp and backend.dtype shape a roofline: they need backend.shape and backend.gpu")
        return self

    def cost(self) -> StepCost:
        """The step-time model these options name: a roofline, linear, a profile, or the preset."""
        from batchlab.backends.presets import load_cost
        if self.shape is not None:
            from batchlab.backends.gpus import gpu
            from batchlab.backends.model_shape import load_shape
            from batchlab.backends.roofline import roofline
            return roofline(load_shape(self.shape, self.dtype), gpu(self.gpu), self.tp)
        if self.linear is not None:
            return linear_cost(self.linear.step_ms, self.linear.per_seq_ms)
        return load_cost(self.preset, self.profile)

    def vocab_size(self) -> int:
        from batchlab.backends.presets import load_vocab_size
        if self.shape is not None:
            from batchlab.backends.model_shape import load_model_config
            fields, _ = load_model_config(self.shape)
            return int((fields.get("text_config") or fields).get("vocab_size", DEFAULT_VOCAB_SIZE))
        return load_vocab_size(self.preset, self.profile)

    def build(self, cfg) -> SimulatedBackend:
        return SimulatedBackend(self.cost(), vocab_size=self.vocab_size())

    def preflight(self, cfg) -> list[str]:
        from batchlab.backends.presets import check_cost
        if self.shape is not None:
            self.cost()                    # the shape is readable, the GPU known, the weights fit
        elif self.linear is None:
            check_cost(self.preset, self.profile)
        return []

    def replica_count(self) -> int:
        return self.replicas

    def pricing(self) -> Pricing | None:
        if self.gpu is not None:
            from batchlab.backends.gpus import gpu
            price = gpu(self.gpu).usd_per_hour if self.usd_per_gpu_hour is None else self.usd_per_gpu_hour
            return Pricing(self.tp, price)
        return None if self.usd_per_gpu_hour is None else Pricing(1, self.usd_per_gpu_hour)

    def model_names(self) -> tuple[str, ...]:
        return (self.shape,) if self.shape is not None else (self.preset,)


class SimulatedBackend(Engine):
    virtual_time = True

    def __init__(self, cost: StepCost, enforce_memory: bool = True, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 decode_windows: bool = True):
        self.cost = cost
        self.enforce_memory = enforce_memory
        self.decode_windows = decode_windows   # False: one step per call (bit-identical, slower; tests compare the two)
        self.vocab = vocab_size     # token ids a prompt may use (the preset's model's vocabulary)
        self.steps = 0              # forward passes charged so far
        self.busy_s = 0.0           # simulated seconds spent in steps
        self._stall_clock = 0.0     # cumulative prefill seconds of all steps (see _charge_stalls)
        self._stall_mark: dict[Request, float] = {}   # decoding row -> _stall_clock when it began
        self.front_end_due = 0.0    # front-end seconds the engine's processor owes: added to the next step
        self._last_start = -math.inf   # when the latest step began: a request handed over after it came as it arrived

    async def start(self, clock: Clock) -> None:
        """A new run: stall accounting starts from zero, so a point's numbers never depend on
        the points run before it in the same process (resume must reproduce them exactly)."""
        self._stall_clock = 0.0
        self._stall_mark.clear()
        self.front_end_due = 0.0
        self._last_start = -math.inf

    def front_end(self, seconds: float) -> None:
        """Front-end work done on the engine's processor since the last step: the next step is
        that much longer (the two take turns on the same cores)."""
        self.front_end_due += seconds

    def describe(self) -> dict[str, Any]:
        return {"backend": "sim", "device": self.cost.description or self.cost.name,
                "model": self.cost.name, "dtype": "simulated", "preset_kind": preset_kind(self.cost)}

    def facts(self) -> EngineFacts:
        return EngineFacts(frozenset({"request", "iteration"}), decode_windows=self.decode_windows,   # see _window
                           kv_bytes_per_token=self.cost.kv_bytes_per_token,
                           kv_budget_bytes=self.cost.kv_budget_bytes, vocab_size=self.vocab,
                           arrival_delay_s=self.cost.arrival_delay_s, frontend_engine_s=self.cost.frontend_engine_s,
                           frontend_engine_s_per_token=self.cost.frontend_engine_s_per_token)

    def batch_step_times(self, prompt_lens: list[int], output_lens: list[int]) -> np.ndarray:
        """Durations of each step of a padded request-level batch, as generate() runs it: every
        step holds all b rows at the padded context p + k (padding costs like real tokens), step 0
        also computes the b x p padded prompt tokens, and every step decodes b rows."""
        b, p, o = len(prompt_lens), max(prompt_lens), max(output_lens)
        k = np.arange(o, dtype=np.int64)
        first = k == 0
        prefill = np.where(first, b * p, 0)
        return self.cost.step_time(b * (p + k), prefill, b, np.where(first, b * attention_pairs(p, 0), 0.0),
                                   np.where(first, b, 0), warm_weight(k))

    async def run_batch(self, requests: list[Request], clock: Clock) -> None:
        p = max(r.prompt_len for r in requests)
        o = max(r.max_new_tokens for r in requests)
        if self.enforce_memory and len(requests) * (p + o) * self.cost.kv_bytes_per_token > self.cost.kv_budget_bytes:
            n, budget = len(requests), self.cost.kv_budget_bytes // self.cost.kv_bytes_per_token
            raise OutOfMemory(f"a batch of {n} padded to {p + o:,} tokens needs {n * (p + o):,} KV tokens, budget {budget:,}")
        durations = self.batch_step_times([r.prompt_len for r in requests], [r.max_new_tokens for r in requests])
        start = clock.now()
        stamps = (start + np.cumsum(durations)).tolist()
        self.steps += len(stamps)
        self.busy_s += stamps[-1] - start
        if isinstance(clock, VirtualClock):
            await clock.sleep(stamps[-1] - start)
            for r in requests:
                r.token_times.extend(stamps[: r.max_new_tokens])
            return
        for i, t in enumerate(stamps):  # real time: advance step by step so tokens stream
            await clock.sleep(t - clock.now())
            now = clock.now()
            for r in requests:
                if i < r.max_new_tokens:
                    r.token_times.append(now)

    async def step(self, step: Step, clock: Clock) -> int:
        if step.repeat > 1:                    # a window, in one jump of the clock
            stamps, starting, shortest = self._window(step, clock.now())
            await clock.sleep_until(stamps[-1])
            if len(stamps) <= shortest:        # nobody finished before the window's end
                for r, _ in step.chunks:
                    r.token_times.extend(stamps)
            else:                              # a row leaves the window with its last token
                ran = len(stamps)
                for r, _ in step.chunks:
                    left = r.max_new_tokens - len(r.token_times)
                    r.token_times.extend(stamps if left >= ran else stamps[:left])
            for r, _ in starting:              # first token after a (re)prefill: decoding from now
                self._stall_mark[r] = self._stall_clock
            return len(stamps)
        context = prefill = decode = 0
        emit, prefilling, starting = [], [], []
        for r, n in step.chunks:               # NOTE: hot path; properties inlined
            done = r.num_computed_tokens + n
            context += done
            total = r.prompt_len + len(r.token_times)
            if n == 1 and done == total and total > r.prompt_len:
                decode += 1
            else:
                prefill += n
                prefilling.append((r, n))
                if done >= total:
                    starting.append(r)         # first token after a (re)prefill: decoding from now
            if done >= total:
                emit.append(r)
        pairs, admitted, arrived = self._prompt_terms(prefilling, clock.now())
        dt = self.cost.step_time(context, prefill, decode, pairs, admitted, arrived=arrived)
        if self.front_end_due:
            dt, self.front_end_due = dt + self.front_end_due, 0.0
        self._charge_stalls(prefill, prefilling)
        self.steps += 1
        self.busy_s += dt
        await clock.sleep(dt)
        now = clock.now()
        for r in emit:
            r.token_times.append(now)
        for r in starting:
            self._stall_mark[r] = self._stall_clock
        return 1

    def _window(self, step: Step, start: float) -> tuple[list[float], list[tuple[Request, int]], int]:
        """The stamps of `step.repeat` steps from `start`: the step as scheduled (every row gets a
        token from it: a decode, or a prefill that completes its prompt), then decode steps of
        every row that still needs tokens; the rows that were prefilling; and the fewest tokens a
        row needed. Each step's time and stamp are what `step()` would compute, summed in the same
        order, so the results are bit-identical; the window ends after the first step reaching
        `until`. `len(stamps)` is the steps it ran."""
        chunks = step.chunks
        rows = len(chunks)
        context = prefill = 0
        shortest = sys.maxsize
        prefilling = []
        for r, n in chunks:                    # NOTE: hot path (every row of every window)
            context += r.num_computed_tokens + n
            had = len(r.token_times)
            if n != 1 or not had:              # step()'s test, given that every row gets a token
                prefill += n
                prefilling.append((r, n))
            if r.max_new_tokens - had < shortest:
                shortest = r.max_new_tokens - had
        pairs, admitted, arrived = self._prompt_terms(prefilling, start)
        dt = self.cost.step_time(context, prefill, rows - len(prefilling), pairs, admitted, arrived=arrived)
        if self.front_end_due:                 # added as step() adds it, so the sums agree bit for bit
            dt, self.front_end_due = dt + self.front_end_due, 0.0
        first = start + dt
        if prefill:
            self._charge_stalls(prefill, prefilling)
        until = math.inf if step.until is None else step.until
        stamps = [first]
        if first < until and step.repeat <= shortest:
            stamps += self.cost.decode_ends(first, context + rows, rows, step.repeat - 1, until)
        elif first < until:
            stamps += self._past_finishes(chunks, first, step.repeat, until)
        self.steps += len(stamps)
        self.busy_s += stamps[-1] - start
        return stamps, prefilling, shortest

    def _prompt_terms(self, prefilling: list[tuple[Request, int]], start: float) -> tuple[float, int, int]:
        """For the model's attention and admission terms, of a step starting at `start`: the
        attention pairs of its prompt chunks, the requests starting their prompt, and of those the
        ones taken as they came (handed to the scheduler after the previous step began; the rest
        waited in its queue). Zeros, skipped as free, when the model has none of these terms."""
        last, self._last_start = self._last_start, start
        if not prefilling or not (self.cost.attn_s_per_pair or self.cost.admit_s or self.cost.admit_s_per_row):
            return 0.0, 0, 0
        pairs = sum(attention_pairs(n, r.num_computed_tokens) for r, n in prefilling)
        starting = [r for r, _ in prefilling if r.num_computed_tokens == 0]
        if not self.cost.admit_s_per_row:      # only the per-row price asks who came from a queue
            return pairs, len(starting), 0
        return pairs, len(starting), sum(r.handed_time is None or r.handed_time > last for r in starting)

    def _past_finishes(self, chunks: list[tuple[Request, int]], start: float, repeat: int, until: float) -> list[float]:
        """Ends of steps 1 .. repeat-1 of a window that rows leave once they have all their tokens:
        one `decode_ends` per stretch between two finishes, over the rows still in it."""
        rows = sorted([(r.max_new_tokens - len(r.token_times), r.num_computed_tokens + n) for r, n in chunks])
        context, active = sum(done for _, done in rows), len(rows)   # done: computed after step 0
        ends, t, i, j = [], start, 1, 0
        while i < repeat:
            while j < len(rows) and rows[j][0] <= i:   # its last token came from step i - 1
                context -= rows[j][1]
                active -= 1
                j += 1
            if not active:
                break
            stop = repeat if j == len(rows) else min(repeat, rows[j][0])
            stretch = self.cost.decode_ends(t, context + active * i, active, stop - i, until)
            ends += stretch
            if len(stretch) < stop - i or stretch[-1] >= until:   # reached `until`
                break
            t, i = stretch[-1], stop
        return ends

    def _charge_stalls(self, prefill: int, prefilling: list[tuple[Request, int]]) -> None:
        """Stall = step time spent on *other* rows' prompt tokens. A decoding row is charged
        lazily: `_stall_clock` sums the prefill time of every step, and a row pays the growth
        of that sum between starting to decode and `release()`. A row in its first prefill pays
        for the others' prompt tokens in its steps at once ('stall_prefill' too, which the
        driver moves out of the prefill phase).
        NOTE: rows recomputing after a preemption are skipped: the driver charges that whole gap."""
        if not prefill:
            return
        per_token = self.cost.prefill_s_per_token
        self._stall_clock += per_token * prefill
        for r, n in prefilling:
            if not r.token_times and r.num_preemptions == 0:
                charge_stall(r, per_token * (prefill - n), before_first_token=True)

    def release(self, request: Request) -> None:
        mark = self._stall_mark.pop(request, None)
        if mark is not None:
            charge_stall(request, self._stall_clock - mark)
