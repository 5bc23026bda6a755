"""Fit the simulator's step-time model to measured step times.

Each measured step is a row (context tokens, prefill tokens, decode rows) -> seconds, and the
model is linear in its coefficients: t = fixed + kv*context + prefill*prefill_tokens + decode*rows
+ prefill_step*[the step computes prompt tokens] (a prefill pass has its own setup cost).
We solve non-negative least squares on *relative* residuals (each row divided by its time), so a
2 ms decode step counts as much as a 300 ms prefill. The constant term is one number to the data:
overhead and weight read cannot be told apart from step times, so it is reported as `overhead_s`.
NOTE: with the nine coefficients a fit uses by default, exact NNLS is "best feasible unconstrained
fit over every subset of columns" (511 small solves, well under a second for a profile's ~1,000
steps; columns held at zero are left out of the search) - no scipy needed.
The straight lines miss one thing a CPU (and a GPU at small batches) shows: a pass's cost bends
with the tokens it computes (2 rows cost far more than twice 1 row's share; 16 rows less than
twice 8 rows'). What they leave is kept as a shape correction: per token count with enough steps,
the median residual, the linear terms refitted without it (cost.py `shape`).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from batchlab.backends.cost import COEFFS, OPT_IN_TERMS, StepCost, features
from batchlab.errors import ConfigError


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured forward pass and what it contained."""
    context_tokens: float        # KV tokens read by attention, summed over rows
    prefill_tokens: float        # prompt tokens computed
    decode_rows: float           # rows producing a decode token
    seconds: float               # measured duration (median over repeats)
    kind: str = "decode"         # decode | prefill (for reports)
    attn_pairs: float = 0.0      # prompt attention pairs (cost.attention_pairs), summed over rows
    admitted: float = 0.0        # requests whose prompt starts in the step
    warm: float = 0.0            # request-level decode: cost.warm_weight of the step's index in its call

    def features(self) -> tuple[float, ...]:
        return features(self.context_tokens, self.prefill_tokens, self.decode_rows, self.attn_pairs,
                        self.admitted, self.warm)


def samples_from(rows: Iterable[dict]) -> list[StepSample]:
    """The steps a profile's JSON record lists (its `samples`), each row's other keys (the fit's
    own prediction beside it) left out."""
    names = StepSample.__dataclass_fields__
    return [StepSample(**{k: v for k, v in r.items() if k in names}) for r in rows]


def fit_terms(record: dict) -> tuple[str, ...]:
    """The opt-in step-time terms a saved profile (its JSON record) was fitted with: its grid's."""
    return tuple(record.get("grid", {}).get("terms", ()))


def with_fit_terms(record: dict, terms: tuple[str, ...]) -> dict:
    """A saved profile's record that a refit takes as fitted with `terms` (fit_terms)."""
    return record | {"grid": record.get("grid", {}) | {"terms": list(terms)}}


def opt_in_terms(text: str) -> tuple[str, ...]:
    """A command's --with: opt-in step-time terms, comma-separated (`none` or nothing: none of
    them), or one line naming those there are."""
    terms = tuple(t.strip() for t in text.split(",") if t.strip() and t.strip() != "none")
    if bad := [t for t in terms if t not in OPT_IN_TERMS]:
        raise ConfigError(f"--with {', '.join(bad)}: not an opt-in step-time term; those are {', '.join(OPT_IN_TERMS)} "
                          "(none: no such term)")
    return terms


@dataclass(frozen=True)
class Fit:
    coefficients: dict[str, float]   # COEFFS -> seconds per unit
    rms_rel_error: float             # root-mean-square of (fit - measured) / measured
    max_rel_error: float
    mape: float                      # mean absolute relative error
    num_samples: int
    shape: tuple[tuple[float, float], ...] = ()   # (tokens computed, seconds) knots (cost.StepCost.shape_s)

    def predict(self, samples: Iterable[StepSample]) -> np.ndarray:
        """The fitted model's step times, through the simulator's own step-time function."""
        cost = self.to_cost(StepCost(0, 0, 0, 0, 0, kv_bytes_per_token=1, kv_budget_bytes=1))
        return np.array([cost.step_time(s.context_tokens, s.prefill_tokens, s.decode_rows, s.attn_pairs,
                                        s.admitted, s.warm) for s in samples], dtype=np.float64)

    def to_cost(self, base: StepCost) -> StepCost:
        """`base` with the fitted timing coefficients and shape (memory fields are kept)."""
        return replace(base, weight_s=0.0, shape_s=self.shape, **self.coefficients)

    def summary(self) -> dict[str, float]:
        return {"fit_rms_rel_error": self.rms_rel_error, "fit_max_rel_error": self.max_rel_error,
                "fit_mape": self.mape, "fit_samples": self.num_samples}


def design_matrix(samples: list[StepSample]) -> np.ndarray:
    return np.array([s.features() for s in samples], dtype=np.float64).reshape(len(samples), len(COEFFS))


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0, exactly, for a handful of columns; a column of zeros
    gets 0 without entering the search (each column doubles it).
    NOTE: columns are scaled to unit norm first: the features span ten orders of magnitude (a
    constant beside attention pairs of long prompts), and unscaled, rank tests and least squares
    on some subsets go wrong, losing the best feasible one."""
    norms = np.linalg.norm(a, axis=0)
    live = norms > 0
    x = np.zeros(a.shape[1])
    x[live] = _nnls_unit(a[:, live] / norms[live], b) / norms[live]
    return x


def _nnls_unit(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b * b))
    for k in range(1, n + 1):
        for cols in combinations(range(n), k):
            sub = a[:, cols]
            if np.linalg.matrix_rank(sub) < k:
                continue
            x, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(x < 0):
                continue
            res = float(np.sum((sub @ x - b) ** 2))
            if res < best_res - 1e-18:
                best, best_res = np.zeros(n), res
                best[list(cols)] = x
    return best


SHAPE = "shape_s"                   # the correction, held off like a term with `without`
SHAPE_MIN_STEPS = 5                 # a token count needs this many steps to get a knot


def fit_step_times(samples: list[StepSample], without: Iterable[str] = (), with_terms: Iterable[str] = ()) -> Fit:
    """Non-negative, relative-error least squares of the step-time model to `samples`, then the
    shape correction from what it leaves (twice: the lines refitted without the shape); the terms
    named in `without` (and SHAPE) are held at zero, to measure what each one earns, and so are the
    opt-in terms (cost.OPT_IN_TERMS) not named in `with_terms`."""
    unknown = set(without) - set(COEFFS[1:]) - {SHAPE}
    if unknown:
        raise ValueError(f"unknown step-time term(s) {', '.join(sorted(unknown))}; terms: {', '.join((*COEFFS[1:], SHAPE))}")
    if extra := set(with_terms) - set(OPT_IN_TERMS):
        raise ValueError(f"{', '.join(sorted(extra))}: not an opt-in step-time term; those are {', '.join(OPT_IN_TERMS)}")
    without = {*without, *(set(OPT_IN_TERMS) - set(with_terms))}
    if len(samples) < len(COEFFS):
        raise ValueError(f"need at least {len(COEFFS)} step samples to fit, got {len(samples)}")
    y = np.array([s.seconds for s in samples], dtype=np.float64)
    if np.any(y <= 0):
        raise ValueError("step times must be > 0")
    x = design_matrix(samples)
    x[:, [COEFFS.index(t) for t in without if t != SHAPE]] = 0.0     # a zero column: nnls leaves it at 0
    tokens = np.array([s.prefill_tokens + s.decode_rows for s in samples])
    shape: tuple[tuple[float, float], ...] = ()
    for _ in range(1 if SHAPE in without else 2):
        bent = _shape_values(shape, tokens)
        coef = nnls(x / y[:, None], 1.0 - bent / y)          # relative residuals of what the shape leaves
        shape = () if SHAPE in without else _knots(tokens, y - x @ coef)
    rel = (x @ coef + _shape_values(shape, tokens) - y) / y
    return Fit(dict(zip(COEFFS, map(float, coef))), float(np.sqrt(np.mean(rel**2))),
               float(np.max(np.abs(rel))), float(np.mean(np.abs(rel))), len(samples), shape)


def _knots(tokens: np.ndarray, residual: np.ndarray) -> tuple[tuple[float, float], ...]:
    """(tokens, median residual) for every token count with at least SHAPE_MIN_STEPS steps."""
    out = []
    for t in np.unique(tokens):
        r = residual[tokens == t]
        if len(r) >= SHAPE_MIN_STEPS:
            out.append((float(t), float(np.median(r))))
    return tuple(out) if len(out) >= 2 else ()


def _shape_values(shape: tuple[tuple[float, float], ...], tokens: np.ndarray) -> np.ndarray:
    if not shape:
        return np.zeros_like(tokens, dtype=np.float64)
    xs, ys = zip(*shape)
    return np.interp(np.log(np.maximum(tokens, 1)), np.log(xs), ys)
