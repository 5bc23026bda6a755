"""The step-time model: what one forward pass costs, from what it contains.

    t_step = overhead + weight_read + kv_read * context_tokens
             + prefill * prefill_tokens + decode * decode_rows
             + prefill_pass  (only in a step that computes prompt tokens)
             + attn * attention_pairs      (prompt tokens x the tokens each attends to: quadratic in a prompt)
             + admit * admitted_requests   (per request starting its prompt: slot, cache and bookkeeping set-up)
             + warmup * warm               (request-level decode: a call's first steps run slower, fading
                                            linearly to nothing after WARM_STEPS steps)
             + mix * prefill_tokens * decode_rows   (a prompt computed beside decoding rows, beyond what each
                                            costs alone: fitted where prompts were probed beside several
                                            rows, as a server's profile does; vLLM on a CPU fits it at 0)
             + admit_row * admitted_requests * decode_rows   (work an arrival costs the engine's processor
                                            that grows with the batch it joins: not fitted from steps, priced
                                            from what arrivals cost running streams, calibrate/front_end.py)
             + shape(tokens)               (a measured profile's correction by the tokens the pass computes:
                                            small matrix products run below the machine's rate, so cost
                                            bends with size where the terms above are straight lines)
             + beyond * max(0, decode_rows - rows_profiled)   (past the largest batch a black-box profile
                                            measured: its top batches' growth beyond the lines, carried on,
                                            where the shape holds flat)
             + dense * (prefill_tokens + decode_rows) * context_tokens   (opt-in: attention that computes every
                                            query of a step against every key the step reads, masked, rather
                                            than each row against its own keys: a server batching all its rows
                                            into one attention call, as transformers serve's SDPA path does,
                                            pays for rows x context, so its step grows with the square of the
                                            batch; fitted only where asked for, OPT_IN_TERMS)

One model for every strategy: continuous steps are charged by their contents, request-level
batches step by step like Hugging Face `generate()` (every row padded, all decoding to the
longest output). `StepCost.step_time` is the one place the terms are added; the fit
(calibrate/fit.py) estimates the same coefficients from `features`, in the order of COEFFS.
Presets (backends/presets.py) and measured profiles are both `StepCost`s.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError

# The fitted coefficients, in the order of `features()`. NOTE: overhead and weight read cannot be
# told apart from step times, so a fit reports their sum as overhead_s (weight_s = 0).
COEFFS = ("overhead_s", "kv_s_per_token", "prefill_s_per_token", "decode_s_per_row", "prefill_step_s",
          "attn_s_per_pair", "admit_s", "warmup_s", "mix_s_per_token_row", "dense_s_per_pair")
# The terms added after the first five (each measured with and without on held-out traffic):
# zero in presets and in profiles fitted before them, so those simulate exactly as they did.
LATER_TERMS = ("attn_s_per_pair", "admit_s", "warmup_s", "mix_s_per_token_row", "dense_s_per_pair")
# Terms a fit holds at zero unless asked for (fit_step_times `with_terms`): each describes one kind
# of server, and on the others it only lends the fit freedom to bend lines that held-out traffic
# showed to be right (the vLLM twin's defaults each passed a held-out test without it)
OPT_IN_TERMS = ("dense_s_per_pair",)
WARM_STEPS = 32            # request-level decode steps over which a call's warm-up fades out
# Every timing a step-time model holds, in seconds (besides the shape correction's knots): what a
# machine running faster or slower scales
TIME_TERMS = ("overhead_s", "weight_s") + COEFFS[1:] + ("frontend_s", "frontend_s_per_token", "admit_s_per_row",
                                                       "beyond_s_per_row")
# The timings a request pays before its first token and never after: its prompt's pass (per token,
# per prefill step, attention over the prompt, admission) and the server's front end
FIRST_TOKEN_TERMS = ("prefill_s_per_token", "prefill_step_s", "attn_s_per_pair", "admit_s", "frontend_s",
                     "frontend_s_per_token", "admit_s_per_row")


def features(context_tokens: float, prefill_tokens: float, decode_rows: float, attn_pairs: float = 0.0,
             admitted: float = 0.0, warm: float = 0.0) -> tuple[float, ...]:
    """The step-time model's regressors for one step: t_step = sum(coefficient x feature)."""
    return (1.0, float(context_tokens), float(prefill_tokens), float(decode_rows), float(prefill_tokens > 0),
            float(attn_pairs), float(admitted), float(warm), float(prefill_tokens) * float(decode_rows),
            dense_pairs(context_tokens, prefill_tokens, decode_rows))


def dense_pairs(context_tokens, prefill_tokens, decode_rows):
    """(query, key) pairs of a step whose attention takes every query it computes (prompt tokens
    and decode rows) against every key it reads (the context, summed over rows), masked: the
    `dense_s_per_pair` feature (numpy arrays too)."""
    v = (np.asarray(prefill_tokens, dtype=float) + decode_rows) * context_tokens
    return v if np.ndim(v) else float(v)


def attention_pairs(chunk: int, computed: int) -> float:
    """(query, key) pairs of a prompt chunk of `chunk` tokens after `computed` cached ones: each
    attends to everything before it and itself."""
    return chunk * (computed + (chunk + 1) / 2)


def warm_weight(k):
    """The warm-up feature of decode step k >= 1 of a request-level call (numpy arrays too): 1 at
    the start, falling linearly to 0 at WARM_STEPS; 0 for the prefill step k = 0."""
    w = np.clip(1.0 - np.asarray(k, dtype=float) / WARM_STEPS, 0.0, None) * (np.asarray(k) > 0)
    return w if w.ndim else float(w)


@dataclass(frozen=True)
class StepCost:
    overhead_s: float             # per step: launch, scheduling, sampling
    weight_s: float               # per step: reading every weight once
    kv_s_per_token: float         # per token of context read by attention, summed over rows
    prefill_s_per_token: float    # per prompt token computed (compute-bound)
    decode_s_per_row: float       # per decode row (compute for one new token)
    kv_bytes_per_token: int       # 2 x layers x kv_heads x head_dim x dtype bytes
    kv_budget_bytes: int          # memory left for the KV cache after weights and reserve
    name: str = "custom"
    description: str = ""
    prefill_step_s: float = 0.0   # per step with prompt tokens: a prefill pass's fixed setup (fitted by profiles)
    attn_s_per_pair: float = 0.0  # per (prompt token, token it attends to): attention's quadratic part
    admit_s: float = 0.0          # per request whose prompt starts in the step
    warmup_s: float = 0.0         # request-level decode: extra time of a call's first step, fading (warm_weight)
    mix_s_per_token_row: float = 0.0   # per prompt token x decode row computed in one step, beyond both alone
    dense_s_per_pair: float = 0.0  # per (query computed, key read) in one step: attention over the whole batch (dense_pairs)
    frontend_s: float = 0.0       # per request, before any step: a server's front end (HTTP, tokenizing), not a step
    # NOTE: where the front end runs on the processor the steps run on (a server computing on the
    # CPU), its work takes the engine's time: requests pass the front end one after another, and
    # the step running meanwhile is longer by the front end's time (EngineFacts.frontend_engine_s),
    # instead of each arrival being delayed while the engine runs on (a GPU server)
    frontend_on_engine: bool = False
    frontend_s_per_token: float = 0.0   # per prompt token, beside frontend_s: front-end work that grows with the prompt
                                        # (only for a front end on the engine, where requests pass it one at a time)
    first_token_s: float = 0.0    # per request, a delay before the scheduler sees it, never the engine's time: a server's
                                  # time before its scheduler beyond its front end, as a profile reads it, and what a
                                  # validation measured the first token still missing (first_token_moved)
    shape_s: tuple[tuple[float, float], ...] = ()   # (tokens computed, seconds) knots of the shape correction
    # Per request whose prompt starts in the step, taken as it came (not from a queue), x decode rows
    # beside it: priced, not fitted, from arrivals joining running streams with room for them. A
    # saturated burst's queued admissions showed no such cost: charged to them too, it made the
    # twin's burst at 128 sequences slower than at 32 where vLLM ran faster. Arrivals that wait
    # behind a full engine under steady traffic go unpriced too: what they cost is not measured.
    admit_s_per_row: float = 0.0
    # A black-box profile batches no more decode rows than the server's own cap allows. Past the
    # largest batch it measured (`rows_profiled`), each further decode row adds `beyond_s_per_row`
    # beside the lines' own price: the growth of its top two measured batch sizes over what the
    # lines gave them (the shape correction keeps that growth inside the batches measured and
    # holds flat past them). 0: the lines alone past the profile, as before.
    rows_profiled: int = 0
    beyond_s_per_row: float = 0.0

    @property
    def arrival_delay_s(self) -> float:
        """Time between a request's arrival and the engine seeing it, for a front end beside the
        engine (one on the engine's processor queues its requests: frontend_engine_s), and the
        delay beyond any front end (first_token_s)."""
        return (0.0 if self.frontend_on_engine else self.frontend_s) + self.first_token_s

    def __post_init__(self):
        if self.frontend_s_per_token and not self.frontend_on_engine:
            raise ValueError("a front end's time per prompt token is charged on the engine: set frontend_on_engine")

    @property
    def frontend_engine_s(self) -> float:
        """Engine time each request's front end takes, for a front end on the engine's processor."""
        return self.frontend_s if self.frontend_on_engine else 0.0

    @property
    def frontend_engine_s_per_token(self) -> float:
        """Engine time the front end takes per prompt token, beside frontend_engine_s."""
        return self.frontend_s_per_token if self.frontend_on_engine else 0.0

    def shape(self, tokens):
        """The shape correction for a pass computing `tokens` (prompt tokens + decode rows; numpy
        arrays too): the knots' seconds interpolated in log(tokens), flat beyond the end knots."""
        xs, ys = zip(*self.shape_s)
        v = np.interp(np.log(np.maximum(tokens, 1)), np.log(xs), ys)
        return v if np.ndim(v) else float(v)

    def step_time(self, context_tokens, prefill_tokens, decode_rows, attn_pairs=0, admitted=0, warm=0, arrived=None):
        """Seconds of one forward pass, from what it contains. Scalars give one step; numpy arrays
        (of equal length, or scalars mixed in) give one time per step. The only place the model's
        terms are added up: the simulator, the tuner's closed form and the fit all go through it.
        `arrived`: of the `admitted`, those the step took as they came rather than from a queue
        (None: all of them); only they pay admit_s_per_row (see the field).
        NOTE: the later terms are added only when their coefficient is set, so a model without them
        gives the sums it always gave, bit for bit (decode_ends relies on it)."""
        t = (self.overhead_s + self.weight_s + self.kv_s_per_token * context_tokens
             + self.prefill_s_per_token * prefill_tokens + self.decode_s_per_row * decode_rows
             + self.prefill_step_s * (prefill_tokens > 0))
        if self.attn_s_per_pair:
            t = t + self.attn_s_per_pair * attn_pairs
        if self.admit_s:
            t = t + self.admit_s * admitted
        if self.warmup_s:
            t = t + self.warmup_s * warm
        if self.mix_s_per_token_row:
            t = t + self.mix_s_per_token_row * prefill_tokens * decode_rows
        if self.dense_s_per_pair:
            t = t + self.dense_s_per_pair * dense_pairs(context_tokens, prefill_tokens, decode_rows)
        if self.admit_s_per_row:
            t = t + self.admit_s_per_row * (admitted if arrived is None else arrived) * decode_rows
        if self.shape_s:
            t = t + self.shape(prefill_tokens + decode_rows)
        if self.beyond_s_per_row:
            beyond = self.beyond_s_per_row * np.maximum(np.asarray(decode_rows) - self.rows_profiled, 0)
            t = t + (beyond if np.ndim(beyond) else float(beyond))
        return t

    def decode_ends(self, start: float, context_tokens: int, rows: int, steps: int,
                    until: float = math.inf) -> list[float]:
        """End times of up to `steps` decode-only steps of `rows` rows run back to back from
        `start`, the first over `context_tokens` of context and each next one over `rows` more,
        stopping after the first that ends at or after `until`: the running sums of
        `step_time(context, 0, rows)`, bit for bit (the same terms, added in the same order).
        NOTE: a plain loop, not numpy: a simulator's decode window is a dozen steps or so, where
        numpy's per-call cost outweighs its per-element speed several times over."""
        if rows < 1:
            raise ValueError(f"a decode step has at least one row (got {rows})")
        fixed = self.overhead_s + self.weight_s
        kv, per_rows = self.kv_s_per_token, self.decode_s_per_row * rows
        if self.shape_s or self.beyond_s_per_row or self.dense_s_per_pair:   # step_time itself, step by step
            return self._decode_ends_shaped(start, context_tokens, rows, steps, until)
        no_prefill, no_pass = self.prefill_s_per_token * 0, self.prefill_step_s * False
        ends, t = [], start
        stop = context_tokens + rows * steps
        if no_prefill == 0 and no_pass == 0:
            # NOTE: adding a zero changes no sum here (x + 0.0 is x, but for -0.0, which then adds
            # to a time as 0.0 does), so the hot loop skips the two; not so for NaN (an infinite
            # coefficient), which takes the loop below.
            for context in range(context_tokens, stop, rows):
                t += fixed + kv * context + per_rows
                ends.append(t)
                if t >= until:
                    break
            return ends
        for context in range(context_tokens, stop, rows):
            t += fixed + kv * context + no_prefill + per_rows + no_pass
            ends.append(t)
            if t >= until:
                break
        return ends

    def _decode_ends_shaped(self, start: float, context_tokens: int, rows: int, steps: int, until: float) -> list[float]:
        """decode_ends for a model with a shape correction: the running sums of step_time itself."""
        ends, t = [], start
        for context in range(context_tokens, context_tokens + rows * steps, rows):
            t += self.step_time(context, 0, rows)
            ends.append(t)
            if t >= until:
                break
        return ends

    def first_token_moved(self, seconds: float) -> "StepCost":
        """The same model with each request's time before the scheduler moved by `seconds`: added
        as a delay off the engine (first_token_s), or, negative, taken from that delay and then
        from the front end, never below none (a validation's first-token correction)."""
        if seconds >= 0:
            return replace(self, first_token_s=self.first_token_s + seconds)
        cut = min(-seconds, self.first_token_s + self.frontend_s)
        from_delay = min(cut, self.first_token_s)
        return replace(self, first_token_s=self.first_token_s - from_delay, frontend_s=self.frontend_s - (cut - from_delay))

    def scaled(self, k: float, first: float = 1.0) -> "StepCost":
        """The same model on a machine `k` times as slow: every timing and the shape correction's
        seconds times k, and the first-token terms (FIRST_TOKEN_TERMS) times `first` besides; sizes
        and the memory budget unchanged."""
        return replace(self, **{t: k * (first if t in FIRST_TOKEN_TERMS else 1.0) * getattr(self, t) for t in TIME_TERMS},
                       shape_s=tuple((x, k * y) for x, y in self.shape_s))

    @property
    def fixed_s(self) -> float:
        """What every step costs whatever it contains (overhead and the weight read)."""
        return self.step_time(0, 0, 0)

    def added_s(self, context_tokens: float, prefill_tokens: float, decode_rows: float) -> float:
        """What a step's contents add to `fixed_s`: step_time minus the fixed terms, summed term by
        term (no cancellation), for closed forms that price one more sequence."""
        terms = features(context_tokens, prefill_tokens, decode_rows)
        return sum(getattr(self, k) * f for k, f in zip(COEFFS[1:], terms[1:]) if f)

    def to_json(self, path: str | Path, **extra) -> None:
        write_atomic(path, json.dumps(asdict(self) | extra, indent=2))

    @classmethod
    def from_json(cls, path: str | Path) -> "StepCost":
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"backend.profile not found: {p}")
        try:
            return cls.from_record(json.loads(p.read_text()))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise ConfigError(f"{p}: not a batchlab profile: {e}") from None

    @classmethod
    def from_record(cls, data: dict) -> "StepCost":
        """The model a profile's JSON record holds (its other keys, samples and readings, left out)."""
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if "shape_s" in fields:
            fields["shape_s"] = tuple((float(x), float(y)) for x, y in fields["shape_s"])
        return cls(**fields)


def linear_cost(step_ms: float, per_seq_ms: float) -> StepCost:
    """The simplest step-time model, t(b) = step_ms + b x per_seq_ms per step with b sequences
    running (prompt and context tokens free), with no memory limit."""
    return StepCost(step_ms / 1e3, 0.0, 0.0, 0.0, per_seq_ms / 1e3, kv_bytes_per_token=1,
                    kv_budget_bytes=1 << 50, name="linear",
                    description=f"linear: {step_ms:g} ms + {per_seq_ms:g} ms per sequence")
