"""Paired comparisons: every strategy ran on the same traces, so compare them trace by trace.

At one (rate, repeat) two strategies saw identical requests, so their differences are paired.
With at least MIN_REPEATS repeats, the interval is a Student t-interval on the per-repeat
differences: exact when they are normal, and honest with 3 repeats (a percentile bootstrap over
3 differences is about [min, max] and covers ~73%, not 95%). With fewer, a latency percentile
gets its interval from a paired moving-block bootstrap over the requests of each trace (blocks
of consecutive arrivals keep the queue's correlation between neighbours): it covers this trace's
request-to-request noise, not trace-to-trace variation; whole-run numbers (throughput, goodput)
then get none: one run is one number.
Failures are part of every comparison: a failed request is +inf latency (core/metrics.py), in the
summary and in the per-request pairs alike, and a strategy that failed more requests is never
called faster. Also here: crossovers (where one strategy overtakes another); knees are in
capacity.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from batchlab.core.metrics import percentile
from batchlab.core.sustain import ATTAINMENT, GROWTH, queue_slope  # noqa: F401  (the report reads ATTAINMENT as stats.ATTAINMENT)

MIN_REPEATS = 3          # fewer repeats: intervals over requests, and none for whole-run metrics
N_BOOT = 1000            # bootstrap replicates (single-trace block bootstrap)
CONF = 0.95
TIE = 0.02               # relative difference treated as a tie when looking for crossovers

# metric -> (request column, percentile) for latencies; None for whole-run metrics
METRICS: dict[str, tuple[str, float] | None] = {
    "ttft_p50": ("ttft", 50), "ttft_p99": ("ttft", 99), "e2e_p50": ("e2e", 50),
    "e2e_p99": ("e2e", 99), "throughput_tok_s": None, "goodput": None}
LOWER_IS_BETTER = {"ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "tpot_p50", "tpot_p99"}


@dataclass(frozen=True)
class Interval:
    """Difference a - b of one metric, absolute and relative to b, with its interval."""
    estimate: float
    rel: float                       # estimate / b, as a fraction
    low: float = float("nan")
    high: float = float("nan")
    rel_low: float = float("nan")
    rel_high: float = float("nan")
    method: str = "none"             # how the interval was made, in words
    n: int = 0                       # units resampled (repeats or requests)

    @property
    def has_interval(self) -> bool:
        """Both ends known; one may be infinite (failures reach some bootstrap replicates)."""
        return bool(not np.isnan(self.low) and not np.isnan(self.high))

    @property
    def excludes_zero(self) -> bool:
        """The data support a difference (either sign) at the chosen confidence."""
        return self.has_interval and (self.low > 0 or self.high < 0)


@lru_cache(maxsize=64)
def t_quantile(conf: float, df: int) -> float:
    """t such that P(|T| <= t) = conf for Student's t with `df` (integer) degrees of freedom,
    by bisection on the closed-form CDF (Abramowitz & Stegun 26.7.3-4): no scipy needed."""
    lo, hi = 0.0, 1e4
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_within(mid, df) < conf else (lo, mid)
    return (lo + hi) / 2


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t), T ~ Student's t with df degrees of freedom."""
    th = math.atan(t / math.sqrt(df))
    c2 = math.cos(th) ** 2
    term = total = 1.0
    for k in range(2 if df % 2 == 0 else 3, df, 2):
        term *= c2 * (k - 1) / k
        total += term
    if df % 2 == 0:
        return math.sin(th) * total
    return 2 / math.pi * (th + (math.sin(th) * math.cos(th) * total if df > 1 else 0.0))


def t_paired(a: np.ndarray, b: np.ndarray, conf: float = CONF, method: str = "t-interval") -> Interval:
    """Student t-interval of mean(a - b) over paired units (repeats: one seeded trace each).
    The relative interval divides by mean(b), taken as known. NOTE: exact coverage when the
    differences are normal, whatever their number; a bootstrap needs many more to be honest."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = a - b
    n, mean_b = len(d), float(np.mean(b))
    est = float(np.mean(d))
    if n < 2 or not np.all(np.isfinite(d)):
        return Interval(est, _rel(float(np.mean(a)), mean_b), method=method, n=n)
    half = t_quantile(conf, n - 1) * float(np.std(d, ddof=1)) / math.sqrt(n)
    lo, hi = est - half, est + half
    scale = 1 / mean_b if mean_b else float("nan")
    return Interval(est, est * scale, lo, hi, lo * scale, hi * scale, method, n)


def bootstrap_paired(a: np.ndarray, b: np.ndarray, stat, idx: np.ndarray, conf: float = CONF,
                     method: str = "bootstrap") -> Interval:
    """Percentile bootstrap of stat(a) - stat(b), resampling the same pairs for both.
    `stat` maps a (replicates, n) array to (replicates,); `idx` holds the resampled indices."""
    est_a, est_b = stat(a[None, :])[0], stat(b[None, :])[0]
    ra, rb = stat(a[idx]), stat(b[idx])
    tail = (1 - conf) / 2 * 100
    with np.errstate(divide="ignore", invalid="ignore"):
        diff, ratio = ra - rb, ra / rb - 1       # inf where failures reach a replicate; NaN skipped
        est = est_a - est_b
    lo, hi = (float(percentile(diff, q)) for q in (tail, 100 - tail))
    rlo, rhi = (float(percentile(ratio, q)) for q in (tail, 100 - tail))
    return Interval(float(est), _rel(est_a, est_b), lo, hi, rlo, rhi, method, len(a))


def _rel(a: float, b: float) -> float:
    """a / b - 1; NaN where it means nothing (b is 0, or either side is infinite)."""
    return float(a / b - 1) if b and np.isfinite(a) and np.isfinite(b) else float("nan")


def iid_indices(n: int, rng: np.random.Generator, n_boot: int = N_BOOT) -> np.ndarray:
    return rng.integers(0, n, size=(n_boot, n))


def block_indices(n: int, rng: np.random.Generator, n_boot: int = N_BOOT, block: int | None = None) -> np.ndarray:
    """Circular moving-block bootstrap: n indices made of runs of `block` consecutive ones.
    NOTE: block ~ sqrt(n) is on the long side, which widens rather than narrows the interval."""
    block = block or max(1, int(np.ceil(np.sqrt(n))))
    k = -(-n // block)
    starts = rng.integers(0, n, size=(n_boot, k))
    idx = (starts[:, :, None] + np.arange(block)) % n
    return idx.reshape(n_boot, k * block)[:, :n]


def percentile_stat(q: float):
    """Percentile of each row. NaN (a request missing from one side) is skipped; +inf (a failed
    request) is a value, so a percentile that failures reach is inf (core/metrics.percentile)."""
    def stat(x: np.ndarray) -> np.ndarray:
        if np.isfinite(x).all():                 # the common case: numpy's partition is faster
            return np.percentile(x, q, axis=1)
        return percentile(x, q)
    return stat


def mean_stat(x: np.ndarray) -> np.ndarray:
    return np.nanmean(x, axis=1)


def compare(summary: pd.DataFrame, requests: pd.DataFrame | None, a: str, b: str,
            metrics=tuple(METRICS), seed: int = 0) -> pd.DataFrame:
    """One row per (rate, metric): a's and b's values, a - b with its interval, the method, and
    each side's failures over the compared repeats (requests, finished, failed). `supported` is
    False for a latency gain of the side that failed more requests; `note` then says why."""
    rng = np.random.default_rng(seed)
    rows = []
    for rate in sorted(summary["rate"].unique()):
        at = summary[summary["rate"] == rate]
        pa, pb = (at[at["strategy"] == s].set_index("repeat") for s in (a, b))
        reps = sorted(set(pa.index) & set(pb.index))
        if not reps:
            continue
        fails = {f"{k}_{col}": total for k, p in (("a", pa), ("b", pb)) for col, total in _failures(p.loc[reps]).items()}
        for m in metrics:
            iv = _compare_metric(m, pa.loc[reps], pb.loc[reps], requests, a, b, rate, rng)
            note = _failure_note(m, iv, a, b, fails)
            rows.append({"rate": rate, "metric": m, "a": a, "b": b,
                         # NOTE: means, like the difference (with 1-2 repeats mean and median agree)
                         "a_value": float(pa.loc[reps, m].mean()), "b_value": float(pb.loc[reps, m].mean()),
                         **iv.__dict__, "supported": iv.excludes_zero and not note, "note": note, **fails})
    return pd.DataFrame(rows)


def _failures(points: pd.DataFrame) -> dict[str, int]:
    """Measured requests, finished and failed, summed over the compared repeats (0 if unknown)."""
    get = lambda col: int(points[col].fillna(0).sum()) if col in points else 0  # noqa: E731
    requests, failed = get("num_requests"), get("failed")
    finished = get("finished") if "finished" in points else requests - failed
    return {"requests": requests, "finished": finished, "failed": failed}


def _failure_note(m: str, iv: Interval, a: str, b: str, fails: dict[str, int]) -> str:
    """Why a latency difference is not a claim: the faster side failed more requests."""
    if m not in LOWER_IS_BETTER or not np.isfinite(iv.estimate) or iv.estimate == 0:
        return ""
    fast, slow = ("a", "b") if iv.estimate < 0 else ("b", "a")
    if fails[f"{fast}_failed"] <= fails[f"{slow}_failed"]:
        return ""
    name = {"a": a, "b": b}
    return (f"{name[fast]} failed more requests ({fails[f'{fast}_failed']} of {fails[f'{fast}_requests']} vs "
            f"{fails[f'{slow}_failed']} of {fails[f'{slow}_requests']})")


def _compare_metric(m, pa, pb, requests, a, b, rate, rng) -> Interval:
    va, vb = pa[m].to_numpy(float), pb[m].to_numpy(float)
    if len(va) >= MIN_REPEATS:
        return t_paired(va, vb, method=f"t-interval over {len(va)} repeats")
    if METRICS.get(m) is None or requests is None:
        return Interval(float(np.mean(va - vb)), _rel(np.mean(va), np.mean(vb)),
                        method="one run per strategy" if len(va) == 1 else f"{len(va)} runs per strategy")
    column, q = METRICS[m]
    parts = [_paired_requests(requests, a, b, rate, rep, column) for rep in pa.index]
    return _pooled_block_bootstrap(parts, q, rng)


def _paired_requests(requests: pd.DataFrame, a: str, b: str, rate: float, repeat: int, column: str):
    """a's and b's values of `column` for the same measured requests, in arrival order: the set
    summary.csv uses, so a request that did not finish is +inf (even if it had a first token)."""
    sel = requests[(requests["rate"] == rate) & (requests["repeat"] == repeat)
                   & (requests["strategy"].isin([a, b])) & ~requests["warmup"].astype(bool)]
    values = sel[column].astype(float)
    if "status" in sel:
        values = values.where(sel["status"] == "finished", np.inf)
    sel = sel.assign(**{column: values})
    wide = sel.pivot_table(index="request_id", columns="strategy", values=column, aggfunc="first", dropna=False)
    order = sel.drop_duplicates("request_id").set_index("request_id")["arrival_time"]
    wide = wide.reindex(order.sort_values().index)
    return wide.get(a, pd.Series(np.nan, index=wide.index)).to_numpy(float), \
        wide.get(b, pd.Series(np.nan, index=wide.index)).to_numpy(float)


def _pooled_block_bootstrap(parts, q: float, rng) -> Interval:
    """Block bootstrap within each repeat's trace; with 2 repeats the replicate is their mean."""
    stat = percentile_stat(q)
    ivs = [bootstrap_paired(va, vb, stat, block_indices(len(va), rng)) for va, vb in parts if len(va)]
    if not ivs:
        return Interval(float("nan"), float("nan"))
    if len(ivs) == 1:
        n = ivs[0].n
        return Interval(**{**ivs[0].__dict__, "method": f"paired block bootstrap over {n:,} requests of one trace, "
                                                        "which covers this trace's noise only"})
    mean = lambda k: float(np.mean([getattr(i, k) for i in ivs]))  # noqa: E731
    return Interval(mean("estimate"), mean("rel"), mean("low"), mean("high"), mean("rel_low"), mean("rel_high"),
                    f"paired block bootstrap over requests of {len(ivs)} traces (mean), which covers "
                    "these traces' noise only", sum(i.n for i in ivs))


@dataclass(frozen=True)
class Crossover:
    metric: str
    rate: float               # req/s, interpolated where a - b changes sign
    leader_before: str
    leader_after: str


def crossover_rates(rates, a_vals, b_vals, lower_is_better: bool = False, tie: float = TIE) -> list[tuple[float, int, int]]:
    """Where the better of two curves changes: (rate, sign before, sign after), sign +1 = a better.
    Differences within `tie` (relative) are ties and never start or end a lead."""
    x, ya, yb = (np.asarray(v, float) for v in (rates, a_vals, b_vals))
    d = (yb - ya) if lower_is_better else (ya - yb)
    scale = np.maximum(np.abs(ya), np.abs(yb))
    with np.errstate(invalid="ignore"):       # inf - inf where failures reach both sides
        sign = np.where(np.isfinite(d) & (np.abs(d) > tie * scale), np.sign(d), 0).astype(int)
    out, last = [], None
    for i in range(len(x)):
        if sign[i] == 0 or not np.isfinite(d[i]):
            continue
        if last is not None and sign[i] != sign[last]:
            t = d[last] / (d[last] - d[i])               # linear interpolation of a - b
            out.append((float(x[last] + t * (x[i] - x[last])), int(sign[last]), int(sign[i])))
        last = i
    return out


def medians(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (strategy, rate): the median of every numeric column over repeats, in the
    order points were run (rate-major), which every table and plot keeps."""
    return summary.groupby(["strategy", "rate"], sort=False).median(numeric_only=True).reset_index()


def crossovers(summary: pd.DataFrame, a: str, b: str, metrics=("throughput_tok_s", "goodput", "ttft_p99", "e2e_p50")) -> list[Crossover]:
    med = summary.groupby(["strategy", "rate"]).median(numeric_only=True)
    found = []
    for m in metrics:
        if (a not in med.index.get_level_values(0)) or (b not in med.index.get_level_values(0)):
            break
        both = pd.concat([med.loc[a, m], med.loc[b, m]], axis=1, keys=["a", "b"], join="inner").sort_index()
        if m in LOWER_IS_BETTER and "failed" in med:
            both = _no_faster_by_failing(both, med.loc[a, "failed"], med.loc[b, "failed"])
        for rate, before, after in crossover_rates(both.index, both["a"], both["b"], m in LOWER_IS_BETTER):
            found.append(Crossover(m, rate, a if before > 0 else b, a if after > 0 else b))
    return found


def _no_faster_by_failing(both: pd.DataFrame, a_failed: pd.Series, b_failed: pd.Series) -> pd.DataFrame:
    """Latency rows where the lower side failed more requests hold no lead (NaN: skipped)."""
    fa, fb = a_failed.reindex(both.index).fillna(0), b_failed.reindex(both.index).fillna(0)
    faster_failed_more = ((both["a"] < both["b"]) & (fa > fb)) | ((both["b"] < both["a"]) & (fb > fa))
    return both.mask(faster_failed_more)


def past_capacity(summary: pd.DataFrame, requests: pd.DataFrame | None) -> set[tuple[str, float]]:
    """(strategy, rate) points where the queue kept growing: queue wait rises with arrival time
    (slope > GROWTH). NOTE: a finished/offered ratio misfires at light load, where the last
    batch of a naive run waits to fill; without request rows it is the fallback (< 75%)."""
    if requests is None:
        low = summary[summary["requests_per_s"] < 0.75 * summary["rate"]]
        return {(s, float(r)) for s, r in zip(low["strategy"], low["rate"])}
    ok = requests[(requests["status"] == "finished") & (requests["warmup"] == 0)]
    out = set()
    for (s, rate), rows in ok.groupby(["strategy", "rate"]):
        slopes = [queue_slope(g["arrival_time"], g["queue_wait"]) for _, g in rows.groupby("repeat") if len(g) > 2]
        if slopes and np.median(slopes) > GROWTH:
            out.add((s, float(rate)))
    return out
