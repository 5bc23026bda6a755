"""Every metric, computed from request timestamps, here and nowhere else (seed question 0.5).

Per request: queue wait = scheduled - arrival; TTFT = first token - arrival (queue time is
part of what a user waits for); TPOT = (completion - first token) / (n - 1); E2E = completion -
arrival; ITL = every gap between consecutive tokens.
Per run (requests that arrived after warm-up): throughput = output tokens / (last completion -
first arrival); goodput = requests meeting every SLO threshold per second of that window.
NOTE: a request that did not finish counts as +inf in every latency percentile and mean (queue
wait, TTFT, TPOT, E2E): a server that drops its slowest requests must not look faster, so a
percentile that failures reach reads inf (reports print "failed"). ITL pools the gaps of
finished requests only; `failed` and `top_error` say what is missing.
Little's law is a check that can fail: the driver's own count of requests in the system
(run/driver.py Occupancy), time-averaged over a fixed window, against lambda x W from the stamps.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchlab.core.config import SLOConfig
from batchlab.core.request import Request, Status

PERCENTILES = (50, 90, 95, 99)


def per_request(r: Request) -> dict[str, float | None]:
    """Latencies of one request in seconds; None where a stamp is missing."""
    first, last = r.first_token_time, r.completion_time
    n = r.output_len
    return {
        "queue_wait": None if r.scheduled_time is None else r.scheduled_time - r.arrival_time,
        "ttft": None if first is None else first - r.arrival_time,
        "tpot": (last - first) / (n - 1) if last is not None and n > 1 else None,
        "e2e": None if last is None else last - r.arrival_time,
    }


@dataclass(frozen=True, slots=True)
class Response:
    """What a caller receives: a frozen snapshot with the derived per-request metrics (seconds)."""
    request_id: str
    status: Status
    output_text: str
    output_token_ids: tuple[int, ...]
    prompt_len: int
    output_len: int
    queue_wait: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    error: str | None = None

    @classmethod
    def of(cls, r: Request) -> "Response":
        m = per_request(r)
        return cls(r.request_id, r.status, r.output_text, tuple(r.output_token_ids), r.prompt_len,
                   r.output_len, m["queue_wait"], m["ttft"], m["tpot"], m["e2e"], r.error)


def meets_slo(m: dict[str, float | None], slo: SLOConfig) -> bool:
    for key, limit in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s)):
        if limit is not None and (m[key] is None or m[key] > limit):
            return False
    return True


def percentile(values: np.ndarray, q: float, presorted: bool = False) -> np.ndarray:
    """numpy's linear percentile along the last axis, bit for bit, except that +inf (a request
    that failed) is a value like any other and NaN (a missing value) is skipped. numpy returns
    NaN for a percentile on or next to an inf (it computes 0 x inf and inf - inf); here one that
    lands on a finite value is that value, and one that reaches an inf is inf."""
    x = np.asarray(values, dtype=np.float64)
    if not presorted:                   # `values` already sorted along the last axis (NaN last)
        x = np.sort(x, axis=-1)         # NaN sorts last
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], np.nan)
    n = np.sum(~np.isnan(x), axis=-1, keepdims=True)
    vi = np.true_divide(q, 100) * (np.maximum(n, 1) - 1)           # numpy's virtual index
    lo = np.floor(vi).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    a, b = np.take_along_axis(x, lo, -1), np.take_along_axis(x, hi, -1)
    t = vi - lo
    with np.errstate(invalid="ignore"):
        diff = b - a
        out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)   # numpy's _lerp
    out = np.where(t == 0, a, np.where(np.isinf(b), b, out))
    return np.where(n == 0, np.nan, out)[..., 0]


def _pcts(values: Iterable[float | None], name: str) -> dict[str, float]:
    arr = np.sort(np.asarray([v for v in values if v is not None], dtype=np.float64))   # once, not per q
    out = {}
    for q in PERCENTILES:
        out[f"{name}_p{q}"] = float(percentile(arr, q, presorted=True)) if arr.size else float("nan")
    out[f"{name}_mean"] = float(arr.mean()) if arr.size else float("nan")
    return out


FAILED = {"queue_wait": math.inf, "ttft": math.inf, "tpot": math.inf, "e2e": math.inf}


def latencies(r: Request) -> dict[str, float | None]:
    """What a request contributes to the latency statistics: its own for a finished request,
    +inf for one that did not finish (see the module docstring)."""
    return per_request(r) if r.status is Status.FINISHED else FAILED


def measured(requests: Iterable[Request], warmup_end: float) -> list[Request]:
    """Requests that count: those that arrived after warm-up."""
    return [r for r in requests if r.arrival_time >= warmup_end]


def summarize(requests: list[Request], slo: SLOConfig = SLOConfig(),
              in_system: list[tuple[float, int]] | None = None,
              window: tuple[float, float] | None = None, closed: bool = False) -> dict[str, Any]:
    """Per-run aggregates over already-filtered requests (see `measured`).
    Throughput is over first arrival to last completion; `closed` (a closed loop, whose users stop
    sending at the window's end and then wait out their answers) counts it over `window` instead:
    there arrivals per second are completions per second, and the drain after the users stop is
    an artifact of stopping, longer the more users wait, not a cost of the load.
    `in_system` and `window` feed the Little's-law check (see `littles_law`): the driver's
    changes to its count of requests in the system, and [warm-up end, end of traffic] in the
    requests' seconds. Without them: the stamps' own count, over first to last arrival."""
    ok = [r for r in requests if r.status is Status.FINISHED]
    rows = [per_request(r) for r in ok]
    out: dict[str, Any] = {"num_requests": len(requests), "finished": len(ok),
                           "failed": sum(r.status is Status.FAILED for r in requests),
                           "unfinished": sum(not r.is_done for r in requests),
                           "top_error": top_error(requests)}
    span = window[1] - window[0] if closed and window is not None and ok else _window(requests, ok)
    tokens = sum(r.output_len for r in ok)
    out["window_s"] = span
    out["throughput_tok_s"] = tokens / span if span > 0 else float("nan")
    out["requests_per_s"] = len(ok) / span if span > 0 else float("nan")
    good = sum(meets_slo(m, slo) for m in rows)
    out["goodput"] = good / span if span > 0 else float("nan")
    out["slo_attainment"] = good / len(requests) if requests else float("nan")
    every = [latencies(r) for r in requests]
    for key in ("queue_wait", "ttft", "tpot", "e2e"):
        out |= _pcts((m[key] for m in every), key)
    out |= _pcts(_itls(ok), "itl")
    if window is None:
        window = (min((r.arrival_time for r in requests), default=0.0),
                  max((r.arrival_time for r in requests), default=0.0))
    out |= littles_law(requests, window, in_system)
    out["mean_output_len"] = tokens / len(ok) if ok else float("nan")
    out["preemptions"] = sum(r.num_preemptions for r in requests)
    return out


def prompt_tokens(r: Request) -> dict[str, int | None]:
    """Prompt tokens reused from the prefix cache and computed, at the request's latest admission
    (None for a request never admitted). Recomputation after a preemption is not counted twice."""
    if r.scheduled_time is None:
        return {"cached_prompt_tokens": None, "computed_prompt_tokens": None}
    return {"cached_prompt_tokens": r.num_cached_tokens, "computed_prompt_tokens": r.prompt_len - r.num_cached_tokens}


def prefix_cache(requests: list[Request], block_size: int) -> dict[str, float | int]:
    """Prefix-cache hit rates over the admitted requests: prompt tokens served from the cache
    over prompt tokens, and cached blocks over full prompt blocks (only full blocks are cached)."""
    admitted = [r for r in requests if r.scheduled_time is not None]
    cached = sum(r.num_cached_tokens for r in admitted)
    prompt = sum(r.prompt_len for r in admitted)
    blocks = sum(r.prompt_len // block_size for r in admitted)
    return {"prefix_hit_rate_tokens": cached / prompt if prompt else float("nan"),
            "prefix_hit_rate_blocks": cached // block_size / blocks if blocks else float("nan"),
            "cached_prompt_tokens": cached, "computed_prompt_tokens": prompt - cached}


def top_error(requests: Iterable[Request]) -> str:
    """The most common reason among failed requests ("" if none failed), for the verdict."""
    counts = Counter(r.error or "no reason recorded" for r in requests if r.status is Status.FAILED)
    return counts.most_common(1)[0][0] if counts else ""


def _window(requests: list[Request], ok: list[Request]) -> float:
    if not ok:
        return 0.0
    start = min(r.arrival_time for r in requests)
    return max(r.completion_time for r in ok) - start


def _itls(ok: list[Request]) -> np.ndarray:
    gaps = [np.diff(r.token_times) for r in ok if r.output_len > 1]
    return np.concatenate(gaps) if gaps else np.empty(0)


def littles_law(requests: list[Request], window: tuple[float, float],
                in_system: list[tuple[float, int]] | None = None) -> dict[str, Any]:
    """Little's law as a check that can fail, over the fixed window [start, end] (warm-up end to
    end of traffic, where the system is in its steady state if it has one):
      little_L         time-average over the window of the number of requests in the system, from
                       `in_system`: the driver's own changes to its count (time, +1 or -1; several
                       replicas' changes simply concatenate). None (a server backend, no driver):
                       counted from the stamps of `requests` instead ("little_source": "stamps"),
                       which no longer catches a lost request or a wrong stamp;
      little_lambda_W  arrivals in the window per second x their mean E2E, from the stamps;
      little_gap       little_L / little_lambda_W - 1.
    Both sides count only requests that finished (the driver leaves failed ones out: they have
    no E2E). Requests at the window's edges make the gap a few percent at most in steady state;
    a request the driver counted but the stamps lost, or a completion stamp moved after the
    driver handed the request back, shows as a larger gap. Past capacity no steady state
    exists and the gap is large by nature. NaN only when the window is empty (end <= start)."""
    start, end = window
    span = end - start
    if span <= 0:
        nan = float("nan")
        return {"little_L": nan, "little_lambda_W": nan, "little_gap": nan, "little_source": ""}
    source = "driver" if in_system is not None else "stamps"
    if in_system is None:
        in_system = stamped_in_system(requests)
    inside = [r for r in requests if r.status is Status.FINISHED and start <= r.arrival_time <= end]
    w = float(np.mean([r.completion_time - r.arrival_time for r in inside])) if inside else 0.0
    lam_w = len(inside) / span * w
    big_l = time_average(in_system, start, end)
    gap = big_l / lam_w - 1 if lam_w > 0 else (0.0 if big_l == 0 else math.inf)
    return {"little_L": big_l, "little_lambda_W": lam_w, "little_gap": gap, "little_source": source}


def stamped_in_system(requests: Iterable[Request]) -> list[tuple[float, int]]:
    """The number of finished requests in the system as the stamps tell it, as changes."""
    out: list[tuple[float, int]] = []
    for r in requests:
        if r.status is Status.FINISHED:
            out += ((r.arrival_time, 1), (r.completion_time, -1))
    return out


def time_average(changes: list[tuple[float, int]], start: float, end: float) -> float:
    """Time-average over [start, end] of a count known by its changes (time, delta), in any
    order; the count is 0 before the first change."""
    if not changes:
        return 0.0
    arr = np.asarray(changes, dtype=np.float64).reshape(-1, 2)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    count = np.cumsum(arr[:, 1])
    edges = np.clip(np.append(arr[:, 0], end), start, end)
    return float(np.sum(count * np.diff(edges)) / (end - start))


def batch_sizes(requests: Iterable[Request]) -> np.ndarray:
    """Sizes of request-level batches, recovered from shared scheduled stamps."""
    counts = Counter(r.scheduled_time for r in requests if r.scheduled_time is not None)
    return np.asarray(sorted(counts.values()), dtype=float)


def max_min_shares(demands: list[float], capacity: float) -> list[float]:
    """Max-min fair split of `capacity` among demands (water-filling): every demand below the
    equal share gets all it asked for, the rest split what is left equally."""
    out = [0.0] * len(demands)
    left, todo = capacity, sorted(range(len(demands)), key=lambda i: demands[i])
    while todo:
        share = left / len(todo)
        i = todo[0]
        if demands[i] <= share:
            out[i] = demands[i]
            left -= demands[i]
            todo.pop(0)
        else:
            for j in todo:
                out[j] = share
            break
    return out


def jain_index(x: list[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one takes all."""
    a = np.asarray(x, dtype=np.float64)
    sq = float((a * a).sum())
    return float(a.sum() ** 2 / (len(a) * sq)) if len(a) and sq > 0 else float("nan")


def tenant_fairness(received: dict[str, float], demanded: dict[str, float]) -> float:
    """Jain's index over tenants of service received / max-min fair share of what was served in
    all (Jain's own normalisation by the fair allocation): 1 when every tenant got its fair share,
    however unequal their demands; a tenant that asked for less than an equal split is due all of it."""
    tenants = sorted(demanded)
    shares = max_min_shares([demanded[t] for t in tenants], sum(received.get(t, 0.0) for t in tenants))
    return jain_index([received.get(t, 0.0) / s for t, s in zip(tenants, shares) if s > 0])
