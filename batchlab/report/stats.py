"""Paired comparisons: every strategy ran on the same traces, so compare them trace by trace.

At one (rate, repeat) two strategies saw identical requests, so their differences are paired.
With at least MIN_REPEATS repeats, an interval comes from bootstrapping the per-trace
differences over repeats. With fewer, a latency percentile gets its interval from a paired
moving-block bootstrap over the requests of each trace (blocks of consecutive arrivals keep the
queue's correlation between neighbours); whole-run numbers (throughput, goodput) then get none:
one run is one number. Also here: crossovers (where one strategy overtakes another) and knees.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_REPEATS = 3          # fewer repeats: intervals over requests, and none for whole-run metrics
N_BOOT = 1000            # bootstrap replicates
CONF = 0.95
ATTAINMENT = 0.90        # a point "meets the SLO" when this share of its requests meets it
TIE = 0.02               # relative difference treated as a tie when looking for crossovers
GROWTH = 0.1             # s of queue wait gained per s of run: above this the queue only grows

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
        return bool(np.isfinite(self.low) and np.isfinite(self.high))

    @property
    def excludes_zero(self) -> bool:
        """The data support a difference (either sign) at the chosen confidence."""
        return self.has_interval and (self.low > 0 or self.high < 0)


def bootstrap_paired(a: np.ndarray, b: np.ndarray, stat, idx: np.ndarray, conf: float = CONF,
                     method: str = "bootstrap") -> Interval:
    """Percentile bootstrap of stat(a) - stat(b), resampling the same pairs for both.
    `stat` maps a (replicates, n) array to (replicates,); `idx` holds the resampled indices."""
    est_a, est_b = stat(a[None, :])[0], stat(b[None, :])[0]
    ra, rb = stat(a[idx]), stat(b[idx])
    tail = (1 - conf) / 2 * 100
    lo, hi = np.nanpercentile(ra - rb, [tail, 100 - tail])
    with np.errstate(divide="ignore", invalid="ignore"):
        rlo, rhi = np.nanpercentile(ra / rb - 1, [tail, 100 - tail])
    return Interval(est_a - est_b, _rel(est_a, est_b), float(lo), float(hi), float(rlo), float(rhi), method, len(a))


def _rel(a: float, b: float) -> float:
    return float(a / b - 1) if b else float("nan")


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
    def stat(x: np.ndarray) -> np.ndarray:
        return np.nanpercentile(x, q, axis=1) if np.isnan(x).any() else np.percentile(x, q, axis=1)
    return stat


def mean_stat(x: np.ndarray) -> np.ndarray:
    return np.nanmean(x, axis=1)


def compare(summary: pd.DataFrame, requests: pd.DataFrame | None, a: str, b: str,
            metrics=tuple(METRICS), seed: int = 0) -> pd.DataFrame:
    """One row per (rate, metric): a's and b's values, a - b with its interval, the method."""
    rng = np.random.default_rng(seed)
    rows = []
    for rate in sorted(summary["rate"].unique()):
        at = summary[summary["rate"] == rate]
        pa, pb = (at[at["strategy"] == s].set_index("repeat") for s in (a, b))
        reps = sorted(set(pa.index) & set(pb.index))
        if not reps:
            continue
        for m in metrics:
            iv = _compare_metric(m, pa.loc[reps], pb.loc[reps], requests, a, b, rate, rng)
            rows.append({"rate": rate, "metric": m, "a": a, "b": b,
                         # NOTE: means, like the difference (with 1-2 repeats mean and median agree)
                         "a_value": float(pa.loc[reps, m].mean()), "b_value": float(pb.loc[reps, m].mean()),
                         **iv.__dict__, "supported": iv.excludes_zero})
    return pd.DataFrame(rows)


def _compare_metric(m, pa, pb, requests, a, b, rate, rng) -> Interval:
    va, vb = pa[m].to_numpy(float), pb[m].to_numpy(float)
    if len(va) >= MIN_REPEATS:
        return bootstrap_paired(va, vb, mean_stat, iid_indices(len(va), rng),
                                method=f"paired bootstrap over {len(va)} repeats")
    if METRICS.get(m) is None or requests is None:
        return Interval(float(np.mean(va - vb)), _rel(np.mean(va), np.mean(vb)),
                        method="one run per strategy" if len(va) == 1 else f"{len(va)} runs per strategy")
    column, q = METRICS[m]
    parts = [_paired_requests(requests, a, b, rate, rep, column) for rep in pa.index]
    return _pooled_block_bootstrap(parts, q, rng)


def _paired_requests(requests: pd.DataFrame, a: str, b: str, rate: float, repeat: int, column: str):
    """a's and b's values of `column` for the same measured requests, in arrival order (NaN if failed)."""
    sel = requests[(requests["rate"] == rate) & (requests["repeat"] == repeat)
                   & (requests["strategy"].isin([a, b])) & ~requests["warmup"].astype(bool)]
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
        return Interval(**{**ivs[0].__dict__, "method": f"paired block bootstrap over {n} requests of one trace"})
    mean = lambda k: float(np.mean([getattr(i, k) for i in ivs]))  # noqa: E731
    return Interval(mean("estimate"), mean("rel"), mean("low"), mean("high"), mean("rel_low"), mean("rel_high"),
                    f"paired block bootstrap over requests of {len(ivs)} traces (mean)", sum(i.n for i in ivs))


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
    sign = np.where(np.abs(d) <= tie * scale, 0, np.sign(d)).astype(int)
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
        for rate, before, after in crossover_rates(both.index, both["a"], both["b"], m in LOWER_IS_BETTER):
            found.append(Crossover(m, rate, a if before > 0 else b, a if after > 0 else b))
    return found


def knee(summary: pd.DataFrame, strategy: str, target: float = ATTAINMENT) -> float | None:
    """The highest tested rate at which the median SLO attainment reaches `target` (None: none)."""
    s = summary[summary["strategy"] == strategy].groupby("rate")["slo_attainment"].median()
    ok = s[s >= target]
    return float(ok.index.max()) if len(ok) else None


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
        slopes = [np.polyfit(g["arrival_time"], g["queue_wait"], 1)[0]
                  for _, g in rows.groupby("repeat") if len(g) > 2]
        if slopes and np.median(slopes) > GROWTH:
            out.add((s, float(rate)))
    return out
