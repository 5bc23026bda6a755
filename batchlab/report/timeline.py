"""What happened over time in one run, rebuilt from its request rows alone.

A request is queued from arrival until it is first scheduled and running from then until its
last token, so queue depth and running set are step functions built from those stamps.
Request-level batches share a `scheduled_time`, which recovers each batch: its size B, its
longest output and prompt, hence the useful share of decode work sum(o_i) / (B x max o_i).
A burst (traffic.rate_step) is judged against the run before it: peak queue depth, time until
the windowed p99 TTFT is back to the baseline p99 for good, and seconds spent missing the SLO.
Every function here copes with a run where nothing finished, or nothing arrived: an empty
series, a None, never an exception or a numpy warning.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchlab.core.metrics import percentile
from batchlab.report.stats import ATTAINMENT

RECOVERY_SLACK = 1.2     # "back to baseline": windowed p99 TTFT within 20% of the baseline p99
SUSTAIN = 3              # ... for this many consecutive windows


def occupancy(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Step function of how many [start, end) intervals cover t: (times, counts after each time).
    Missing ends never close (the interval lasts to the end of the data)."""
    s = np.asarray(starts, float)
    e = np.asarray(ends, float)
    keep = np.isfinite(s) & ~(e <= s)   # NOTE: an empty interval (admitted on arrival) never occupies
    s, e = s[keep], e[keep]
    e = e[np.isfinite(e)]
    t = np.concatenate([s, e])
    d = np.concatenate([np.ones(len(s)), -np.ones(len(e))])
    order = np.lexsort((d, t))          # NOTE: at equal times, leave before enter: no phantom peaks
    return t[order], np.cumsum(d[order])


def _failed(rows: pd.DataFrame) -> pd.Series:
    if "status" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["status"].eq("failed")


def queue_depth(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Requests that have arrived but not yet been scheduled."""
    end = rows["scheduled_time"].where(rows["scheduled_time"].notna(), rows["completion_time"])
    # NOTE: a request refused before it was scheduled (rejected, invalid) carries no stamp of when;
    # it leaves the queue at its arrival instead of waiting there forever
    end = end.where(end.notna() | ~_failed(rows), rows["arrival_time"])
    return occupancy(rows["arrival_time"], end)


def running(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Rows in the running batch over time. NOTE: a lockstep (request-level) row holds its slot
    until its whole batch ends, not just until its own last token; continuous rows leave at once.
    A failed row with no completion (a batch out of memory) leaves at its last stamp."""
    end = rows["completion_time"]
    lockstep = rows["trigger"].notna() & rows["scheduled_time"].notna()
    if lockstep.any():
        batch_end = rows[lockstep].groupby("scheduled_time")["completion_time"].transform("max")
        end = end.where(~lockstep, batch_end.reindex(rows.index))
    cols = [c for c in ("scheduled_time", "first_token_time") if c in rows]
    gone = _failed(rows) & end.isna()
    if gone.any():
        end = end.where(~gone, rows.loc[gone, cols].max(axis=1).reindex(rows.index))
    return occupancy(rows["scheduled_time"], end)


def peak(t: np.ndarray, n: np.ndarray, t0: float = -np.inf, t1: float = np.inf) -> int:
    """Largest count in [t0, t1), including the level carried in from before t0."""
    if not len(t):
        return 0
    inside = (t >= t0) & (t < t1)
    before = np.nonzero(t < t0)[0]
    vals = list(n[inside]) + ([n[before[-1]]] if len(before) else [])
    return int(max(vals)) if vals else 0


def batches(rows: pd.DataFrame) -> pd.DataFrame:
    """Request-level batches, one row each: size, prompt and output totals and maxima, useful work."""
    done = rows[(rows["status"] == "finished") & rows["trigger"].notna()]   # continuous has no trigger
    keys = ["strategy", "rate", "repeat", "scheduled_time"]
    g = done.groupby(keys)
    b = pd.DataFrame({"size": g.size(), "sum_o": g["output_len"].sum(), "max_o": g["output_len"].max(),
                      "sum_p": g["prompt_len"].sum(), "max_p": g["prompt_len"].max()}).reset_index()
    b["useful_decode"] = b["sum_o"] / (b["size"] * b["max_o"])
    b["prompt_fill"] = b["sum_p"] / (b["size"] * b["max_p"])
    return b


def useful_work(b: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and rate: share of decode slot-steps and prompt slots that did real work."""
    g = b.assign(slots_o=b["size"] * b["max_o"], slots_p=b["size"] * b["max_p"]).groupby(["strategy", "rate"])
    s = g[["sum_o", "slots_o", "sum_p", "slots_p", "size"]].sum()
    return pd.DataFrame({"useful_decode": s["sum_o"] / s["slots_o"], "prompt_fill": s["sum_p"] / s["slots_p"],
                         "mean_batch": g["size"].mean(), "batches": g.size()}).reset_index()


def rows_still_decoding(output_lens) -> np.ndarray:
    """For one lockstep batch: how many rows still produce a token at each decode step."""
    o = np.sort(np.asarray(output_lens, int))
    if not len(o):
        return np.zeros(0, int)
    steps = np.arange(o.max())
    return len(o) - np.searchsorted(o, steps, side="right")


@dataclass(frozen=True)
class BurstResult:
    strategy: str
    rate: float
    burst_rate: float | None
    baseline_p99_ttft: float       # seconds, requests that arrived before the burst
    peak_queue_before: int
    peak_queue: int                # during and after the burst
    recovery_s: float | None       # after the burst ends; None: not back by the end of the run
    violating_s: float | None      # seconds of windows whose SLO attainment is below target
    window_s: float


def window_for(rate: float) -> float:
    """Bins wide enough to hold ~20 requests at the base rate (a p99 over fewer is just a max).
    A rate of 0 (a replayed trace with one arrival) gets 1 s bins."""
    return float(max(1.0, 20.0 / rate)) if rate > 0 and np.isfinite(rate) else 1.0


def burst(rows: pd.DataFrame, warmup_s: float, at_s: float, until_s: float | None, end_s: float,
          slo: dict | None, burst_rate: float | None = None) -> BurstResult:
    """Burst metrics of one run's rows (one strategy, rate, repeat)."""
    rate = float(rows["rate"].iloc[0])
    w = window_for(rate)
    ok = rows[rows["status"] == "finished"]
    base = ok[(ok["arrival_time"] >= warmup_s) & (ok["arrival_time"] < at_s)]["ttft"].dropna()
    base_p99 = float(np.percentile(base, 99)) if len(base) else float("nan")
    t, n = queue_depth(rows)
    ref = until_s if until_s is not None else at_s
    return BurstResult(str(rows["strategy"].iloc[0]), rate, burst_rate, base_p99,
                       peak(t, n, warmup_s, at_s), peak(t, n, at_s),
                       recovery(rows, ref, end_s, base_p99 * RECOVERY_SLACK, w),
                       violating_seconds(rows, warmup_s, end_s, slo, w) if slo else None, w)


def windowed(rows: pd.DataFrame, t0: float, t1: float, w: float, fn) -> tuple[np.ndarray, np.ndarray]:
    """fn(rows arriving in [t, t + w)) for consecutive windows from t0 to t1 (NaN when empty).
    No end (a run where nothing arrived) gives no windows."""
    if not (np.isfinite(t0) and np.isfinite(t1)):
        return np.zeros(0), np.zeros(0)
    edges = np.arange(t0, t1, w)
    vals = []
    for a in edges:
        sel = rows[(rows["arrival_time"] >= a) & (rows["arrival_time"] < a + w)]
        vals.append(fn(sel) if len(sel) else np.nan)
    return edges, np.asarray(vals, float)


def p99_ttft(sel: pd.DataFrame) -> float:
    v = sel["ttft"].where(sel["status"] == "finished", np.inf)   # a failed request never recovered
    return float(percentile(v.to_numpy(float), 99))   # inf once it reaches a failure (core/metrics.py)


def recovery(rows: pd.DataFrame, ref: float, end_s: float, threshold: float, w: float) -> float | None:
    """Seconds after `ref` until the windowed p99 TTFT is under `threshold` for SUSTAIN windows
    in a row (one lucky window is not a recovery). None: not recovered by the end of the run."""
    if not np.isfinite(threshold):
        return None
    edges, p99 = windowed(rows, ref, end_s, w, p99_ttft)
    good = ~(p99 > threshold)             # NOTE: an empty window (no arrivals) is no evidence against
    for i in range(len(edges)):
        if good[i:i + SUSTAIN].all():
            return float(edges[i] - ref)
    return None


def attainment(sel: pd.DataFrame, slo: dict) -> float:
    ok = sel["status"] == "finished"
    for key in ("ttft", "tpot", "e2e"):
        limit = slo.get(f"{key}_s")
        if limit is not None:
            ok &= sel[key].fillna(np.inf) <= limit   # as core.metrics.meets_slo: missing fails
    return float(ok.mean())


def violating_seconds(rows: pd.DataFrame, t0: float, t1: float, slo: dict, w: float) -> float:
    _, att = windowed(rows, t0, t1, w, lambda sel: attainment(sel, slo))
    return float(np.sum(att < ATTAINMENT) * w)
