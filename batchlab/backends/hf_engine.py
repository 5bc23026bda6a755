"""A step-level engine over a Hugging Face causal LM: one packed forward pass per scheduler step.

Every step's tokens (prefill chunks and one decode token per running request) are packed into
one row, `[1, total_tokens]`, each at its own position, so nothing is padded; K/V live in a slot
cache read by our own attention function (backends/hf_slots.py), and only rows that reach their
end get logits. The pass runs on the process's torch thread (backends/torch_thread.py: every op
from one thread, or OpenMP throttles itself), so the event loop (and arrivals) keep flowing.
The scheduler decides everything (admission, chunks, preemption); this class only executes.
A decode window (`Step.repeat` > 1: identical decode-only steps the scheduler proved safe) runs
as that many passes in one call to that thread, each stamped at its own end.
With prefix caching, a Step's `cache` work is done around the pass (backends/hf_prefix.py).
Tokens are greedy with EOS suppressed, exactly like the request-level backend's `generate()`
(min_new_tokens = max_new_tokens), so every strategy produces the same tokens.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from batchlab.backends import hf_compile as hcomp
from batchlab.backends import torch_thread
from batchlab.backends.hf_fused import forward_for
from batchlab.backends.hf_prefix import BlockStore
from batchlab.backends.hf_slots import ATTN_NAME, SlotKV, StepPlan, attention, slot_attention
from batchlab.core.clock import Clock
from batchlab.core.request import Request
from batchlab.core.work import Step


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one step did and how long it took (seconds), for efficiency and step-time fits."""
    start: float                  # clock reading when the step began
    duration: float               # until its tokens were on the host (device synchronized)
    rows: int                     # requests in the step
    tokens: int                   # tokens computed (prefill + decode)
    prefill_tokens: int           # tokens of rows computing more than one token
    emitted: int                  # new tokens produced (rows that reached their end)
    forward: float = float("nan")  # of `duration`, seconds in the model pass, greedy pick and sync;
                                  # the rest is ours: building the plan, the thread hand-off, the lock
    gap: float = 0.0              # seconds since the engine's previous pass ended: stamping, the
                                  # scheduler, the driver, the event loop (0 inside a decode window)


class StepEngine:
    """Runs `Step`s of the continuous scheduler on `model`; `step_log` keeps one record per pass."""


    def __init__(self, model, tokenizer=None, device=None, compile: bool = False, fused: bool | None = None):
        cfg = model.config.get_text_config()
        # NOTE: we always attend to the full prefix; within a sliding window that is the same thing.
        self.window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        self.model, self.tokenizer = model, tokenizer
        self.device = torch.device(device) if device is not None else model.device
        self.suppress = torch.tensor(_eos_ids(model, tokenizer), dtype=torch.long, device=self.device)
        self.heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.cache = SlotKV(cfg.num_hidden_layers, kv_heads, head_dim, model.dtype, self.device)
        self.prefix = BlockStore()             # cached blocks' K/V, when the scheduler caches prefixes
        self.step_log: list[StepRecord] = []
        self._lock = threading.Lock()          # one forward at a time: the attention swap is global
        self._last_end: float | None = None    # when the previous pass ended (for StepRecord.gap)
        AttentionInterface.register(ATTN_NAME, slot_attention)
        self.forward = forward_for(model, fused, self.device)   # a plan -> its kept rows' logits
        # compile: dense decode-only passes padded to row buckets and run compiled (CPU) or
        # compiled and captured in CUDA graphs (CUDA); everything else eagerly (hf_compile.py)
        self.decode = None
        if compile:
            self.decode = hcomp.CompiledDecode(self.forward, self.suppress)
            if self.device.type == "cuda":
                self.decode = hcomp.GraphedDecode(self.forward, self.suppress, run=self.decode)

    async def step(self, step: Step, clock: Clock) -> int:
        """One forward pass over `step.chunks` (a decode window: up to `step.repeat`); stamps a
        greedy token on every row that reached its end; returns the passes run. Leaves
        `num_computed_tokens` to the scheduler."""
        start = clock.now()
        gap = 0.0 if self._last_end is None else max(0.0, start - self._last_end)
        repeat = step.repeat
        if repeat > 1 and any(n != 1 or r.num_computed_tokens + 1 != r.num_tokens for r, n in step.chunks):
            repeat = 1                         # only pure decode steps repeat identically
        elif repeat > 1:                       # every row runs every pass: stop at the first finish
            repeat = min(repeat, min(r.max_new_tokens - r.output_len for r, _ in step.chunks))
        emit, passes = await torch_thread.run(self._run, step, clock, repeat)
        for r, n in step.chunks:
            self.cache.lengths[self.cache.slot_of[r]] = r.num_computed_tokens + n * len(passes)
        prefill = sum(n for _, n in step.chunks if n > 1)
        rows, log = len(step.chunks), self.step_log
        for tokens, end, forward in passes:
            for r, t in zip(emit, tokens):
                r.stamp_token(end, t)
            log.append(StepRecord(start, end - start, rows, step.num_tokens, prefill, len(tokens), forward, gap))
            start, gap = end, 0.0
        if passes:
            self._last_end = passes[-1][1]
        return len(passes)

    async def warm(self, rows: int, clock: Clock, prompt: int = 8) -> None:
        """With compile on: build the decode graphs of every rows bucket up to `rows` now (at
        start-up, outside any measured window): per bucket a throwaway prefill, two decode passes."""
        if self.decode is None:
            return
        n, ids = 1, [min(10, self.model.config.get_text_config().vocab_size - 1)] * prompt
        self.cache.ensure_slots(hcomp.bucket(rows))
        while True:
            reqs = [Request(f"warm-decode{i}", prompt, 3, clock.now(), index=-1 - i, prompt_token_ids=ids)
                    for i in range(n)]
            await self.step(Step([(r, prompt) for r in reqs]), clock)
            for k in range(2):
                for r in reqs:
                    r.num_computed_tokens = prompt + k
                await self.step(Step([(r, 1) for r in reqs]), clock)
            for r in reqs:
                self.release(r)
            if n >= rows:
                return
            n = min(2 * n, hcomp.bucket(rows))

    def release(self, request: Request) -> None:
        """Free the request's slot (finished, failed or preempted: a preempted one recomputes).
        On the torch thread: freeing a slot copies another slot's K/V into it."""
        torch_thread.call(self.cache.release, request)

    def _plan(self, chunks: list[tuple[Request, int]], extra: int = 0) -> StepPlan:
        cache = self.cache
        longest = max(r.num_computed_tokens + n for r, n in chunks) + extra
        if self.window and longest > self.window:
            raise ValueError(f"{longest} tokens exceed the model's sliding window ({self.window}): "
                             "the step engine attends to the full prefix")
        cache.reserve(longest + 1)             # NOTE: +1: capacity never equals a pass's context (hf_compile)
        slot = {r: cache.slot(r) for r, _ in chunks}
        singles = sorted((c for c in chunks if c[1] == 1), key=lambda c: slot[c[0]])
        ids, pos, slots, keep, emit, multi = [], [], [], [], [], []
        for r, n in singles + [c for c in chunks if c[1] > 1]:
            s, c = slot[r], r.num_computed_tokens
            ids += _token_ids(r, c, n)
            pos += range(c, c + n)
            slots += [s] * n
            if n > 1:
                multi.append((s, len(pos) - n, n, c + n))
            if c + n >= r.num_tokens:
                keep.append(len(pos) - 1)
                emit.append(r)
        as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)
        positions = as_t(pos)
        plan = StepPlan(cache, as_t(ids), positions, as_t(slots), positions, None, None, False,
                        [(s, st, n, ctx, self._causal_mask(c_end=ctx, n=n)) for s, st, n, ctx in multi],
                        0 if len(keep) == len(pos) else as_t(keep), emit)   # 0: every token emits
        if singles:
            taken = [slot[r] for r, _ in singles]
            plan.single_slots = as_t(taken)
            plan.single_mask = self._single_mask({slot[r]: r.num_computed_tokens + 1 for r, _ in singles})
            plan.single_dense = taken == list(range(plan.single_mask.shape[0]))
        return plan

    def _single_mask(self, ends: dict[int, int]) -> torch.Tensor:
        """[S, 1, 1, L]: key j of slot s is visible iff j < its length after this step."""
        S = self.cache.used_range
        lens = [ends.get(s, max(self.cache.lengths[s], 1)) for s in range(S)]
        L = max(lens)
        j = torch.arange(L, device=self.device)
        return self._additive(j[None, :] < torch.tensor(lens, device=self.device)[:, None]).view(S, 1, 1, L)

    def _causal_mask(self, c_end: int, n: int) -> torch.Tensor:
        """[G*n, c_end]: query row g*n + t (token at position c_end-n+t) sees keys up to itself."""
        groups = self.heads // self.cache.shape[1]
        t = torch.arange(n, device=self.device).repeat(groups)
        return self._additive(torch.arange(c_end, device=self.device)[None, :] <= (c_end - n + t)[:, None])

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """0 where visible, -inf elsewhere: exactly what SDPA turns a bool mask into (per call)."""
        return torch.zeros(visible.shape, dtype=self.cache.dtype, device=self.device).masked_fill_(~visible, float("-inf"))

    def _run(self, step: Step, clock: Clock, repeat: int) -> tuple[list[Request], list]:
        """The torch thread: plan the step (growing the cache if it must), bring cached prefix
        blocks in, run its passes, keep the new blocks; the plan's emitting rows and the passes."""
        # NOTE: plan and cache tensors are inference tensors like the pass's own (compile guards on it)
        with torch.inference_mode():
            plan = self._plan(step.chunks, extra=repeat - 1)
            if self.decode is not None and hcomp.decodes_densely(plan):
                hcomp.pad_rows(plan, hcomp.bucket(len(plan.emit)))
            if step.cache is not None:
                self.prefix.before(step.cache, self.cache)
        passes = self._forward(plan, clock, repeat, step.until)
        if step.cache is not None:
            with torch.inference_mode():
                self.prefix.after(step.cache, self.cache)
        return plan.emit, passes

    def _forward(self, plan: StepPlan, clock: Clock, repeat: int = 1,
                 until: float | None = None) -> list[tuple[list[int], float, float]]:
        """The torch thread: `repeat` blocking passes (a decode window feeds each pass the tokens of
        the one before), each followed by the greedy pick and a device sync; per pass (tokens,
        end time, seconds in the pass). A window stops after the first pass ending at or after `until`."""
        passes = []
        run = self.decode if self.decode is not None and hcomp.decodes_densely(plan) else self._eager
        with self._lock, torch.inference_mode(), attention(self.model, ATTN_NAME):
            for k in range(repeat):
                if k:
                    self._advance(plan, passes[-1][0])
                t0 = clock.now()
                tokens = run(plan).tolist()[:len(plan.emit)]   # .tolist() syncs the device
                end = clock.now()
                passes.append((tokens, end, end - t0))
                if until is not None and end >= until:
                    break
        return passes

    def _eager(self, plan: StepPlan) -> torch.Tensor:
        return hcomp.greedy(self.forward, plan, self.suppress)

    def _advance(self, plan: StepPlan, tokens: list[int]) -> None:
        """Next pass of a decode window: every row feeds its new token at the next position
        (padding rows stay at position 0 of their free slot)."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        rows = len(tokens)
        plan.input_ids = F.pad(ids, (0, plan.pad)) if plan.pad else ids
        plan.positions = plan.positions + 1
        if plan.pad:
            plan.positions[rows:] = 0
        plan.write_pos = plan.positions
        plan.single_mask = F.pad(plan.single_mask, (0, 1), value=float("-inf"))   # one more key column
        plan.single_mask[plan.single_slots[:rows], 0, 0, plan.positions[:rows]] = 0.0


def backend_efficiency(records: list[StepRecord], achieved_tok_s: float) -> dict[str, float]:
    """Achieved tokens/s over what the measured step time allows at the run's occupancy:
    B / t_step(B), with B the duration-weighted mean rows per pass and t_step a least-squares
    line (duration vs rows) through the run's decode-only passes. Below 1: idle time, prefill
    passes and per-step overhead, which `step_breakdown` splits. NaN without a decode-only pass."""
    import numpy as np
    dec = [(s.rows, s.duration) for s in records if s.prefill_tokens == 0]
    if not dec or not achieved_tok_s > 0:
        return {"backend_eff": float("nan"), "occupancy": float("nan")}
    occupancy = float(np.average([s.rows for s in records], weights=[s.duration for s in records]))
    rows, t = np.array(dec, dtype=float).T
    slope, icpt = np.polyfit(rows, t, 1) if len(set(rows)) > 1 else (0.0, float(np.median(t)))
    allowed = occupancy / max(icpt + slope * occupancy, 1e-12)
    return {"backend_eff": achieved_tok_s / allowed, "occupancy": occupancy} | step_breakdown(records)


def step_breakdown(records: list[StepRecord]) -> dict[str, float]:
    """Where the records' time went, as fractions of their sum of gaps and durations: model
    passes of decode-only steps, model passes of steps with prefill, our work inside a step
    (plan, hand-off) and between steps (stamping, scheduler, driver); and the median per-step
    overhead (ms) inside a step and between steps. Empty for records without `forward`."""
    import numpy as np
    if not records or any(s.forward != s.forward for s in records):
        return {}
    gaps = [s.gap for s in records[1:]]                 # the first one's precedes the window
    total = sum(s.duration for s in records) + sum(gaps) or 1e-12
    dec = sum(s.forward for s in records if s.prefill_tokens == 0)
    pre = sum(s.forward for s in records if s.prefill_tokens > 0)
    inside = [s.duration - s.forward for s in records]
    return {"decode_frac": dec / total, "prefill_frac": pre / total, "overhead_frac": sum(inside) / total,
            "gap_frac": sum(gaps) / total, "overhead_ms": 1e3 * float(np.median(inside)),
            "gap_ms": 1e3 * float(np.median(gaps)) if gaps else 0.0}


def _eos_ids(model, tokenizer) -> list[int]:
    """The EOS ids `generate()` would suppress: the tokenizer's, else the model's."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
    ids = eos if isinstance(eos, (list, tuple)) else [eos]
    return [i for i in ids if i is not None and i >= 0]


def _token_ids(r: Request, start: int, n: int) -> list[int]:
    """Token ids at positions start..start+n-1 of prompt + generated output."""
    if r.prompt_token_ids is None:
        raise ValueError(f"request {r.request_id} has no prompt_token_ids (the backend's prepare() sets them)")
    p = len(r.prompt_token_ids)
    if start + n <= p:
        return r.prompt_token_ids[start:start + n]
    if start >= p:                                   # a decode token (or recomputed output)
        return r.output_token_ids[start - p:start - p + n]
    return r.prompt_token_ids[start:] + r.output_token_ids[:start + n - p]
