"""What each strategy sustains: the one rule for "sustains" and "knee", used by every sentence,
table and plot that names one.

A tested rate is sustained when core/sustain.py's rule holds on the medians over repeats: at least
ATTAINMENT of the measured requests meet every threshold (a failed request meets none), and
requests completed per second (first arrival to last completion, summary.csv's requests_per_s)
reach SERVED × the rate offered (arrivals per second over the arrival window). The rule lives in
core so the tuner and the capacity search ask the same question. Without an SLO only the
throughput condition applies.
A strategy's capacity is the highest sustained tested rate; `limit` says what broke at the next
rate up (which SLO metric, or the throughput), so a knee is never unexplained.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchlab.core.sustain import ATTAINMENT, SERVED, sustains

MIN_DURATION_S = 30.0    # shorter points get a caveat in the verdict: a slow-growing queue hides
SLO_METRICS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}


@dataclass(frozen=True)
class Capacity:
    strategy: str
    rate: float | None           # highest sustained tested rate (None: not even the lowest)
    highest_tried: bool          # it sustained the highest rate it ran: the true capacity may be higher
    broke_at: float | None       # the first tested rate above `rate` that it did not sustain
    limit: tuple[str, ...] = ()  # what broke there: "TTFT", "TPOT", "E2E" and/or "throughput"
    attainment: float = 0.0      # mean over tested rates of the median SLO attainment: breaks ties


def offered_rates(summary: pd.DataFrame, requests: pd.DataFrame | None) -> pd.Series:
    """Offered req/s per point (index: strategy, rate, repeat): (n − 1) arrivals over the measured
    arrival span, from requests.csv; the nominal rate where request rows are missing."""
    keys = ["strategy", "rate", "repeat"]
    nominal = pd.Series(summary["rate"].astype(float).to_numpy(), index=pd.MultiIndex.from_frame(summary[keys]))
    if requests is None or requests.empty:
        return nominal
    measured = requests[requests["warmup"] == 0]
    span = measured.groupby(keys)["arrival_time"].agg(["min", "max", "count"])
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = (span["count"] - 1) / (span["max"] - span["min"])
    rate = rate[np.isfinite(rate) & (rate > 0)]
    return rate.reindex(nominal.index).fillna(nominal)


def sustained(summary: pd.DataFrame, requests: pd.DataFrame | None, slo: dict) -> pd.DataFrame:
    """One row per (strategy, rate): median attainment, median served share, and `sustained`."""
    s = summary.set_index(["strategy", "rate", "repeat"])
    served = s["requests_per_s"].astype(float).fillna(0.0) / offered_rates(summary, requests)
    points = pd.DataFrame({"served": served, "attainment": s["slo_attainment"].astype(float).fillna(0.0)})
    per_rate = points.groupby(level=["strategy", "rate"], sort=False).median()
    ok = sustains(per_rate["attainment"], per_rate["served"], any(slo.get(k) for k in SLO_METRICS))
    return per_rate.assign(sustained=ok).reset_index()


def capacities(summary: pd.DataFrame, requests: pd.DataFrame | None, slo: dict) -> dict[str, Capacity]:
    """Each strategy's capacity, in the order strategies appear in summary.csv."""
    table = sustained(summary, requests, slo)
    out = {}
    for s in dict.fromkeys(summary["strategy"]):
        rows = table[table["strategy"] == s].sort_values("rate")
        good = rows[rows["sustained"]]["rate"]
        best = float(good.max()) if len(good) else None
        above = rows[~rows["sustained"] & ((rows["rate"] > best) if best is not None else True)]["rate"]
        broke = float(above.min()) if len(above) else None
        limit = _limit(rows[rows["rate"] == broke].iloc[0], requests, s, broke, slo) if broke is not None else ()
        out[s] = Capacity(s, best, best is not None and best == float(rows["rate"].max()), broke, limit,
                          float(rows["attainment"].mean()))
    return out


def _limit(row: pd.Series, requests: pd.DataFrame | None, strategy: str, rate: float, slo: dict) -> tuple[str, ...]:
    """What broke at `rate`: each SLO metric that alone misses ATTAINMENT, and the throughput."""
    broke = [name for name, share in metric_attainment(requests, strategy, rate, slo).items() if share < ATTAINMENT]
    if row["served"] < SERVED:
        broke.append("throughput")
    return tuple(broke)


def metric_attainment(requests: pd.DataFrame | None, strategy: str, rate: float, slo: dict) -> dict[str, float]:
    """Share of measured requests meeting each SLO threshold alone (a failed request meets none),
    pooled over repeats. Empty without request rows."""
    if requests is None:
        return {}
    sel = requests[(requests["strategy"] == strategy) & (requests["rate"] == rate) & (requests["warmup"] == 0)]
    if sel.empty:
        return {}
    done = sel["status"] == "finished"
    out = {}
    for key, name in SLO_METRICS.items():
        if slo.get(key):
            value = pd.to_numeric(sel[key.removesuffix("_s")], errors="coerce")
            out[name] = float((done & (value <= slo[key])).mean())
    return out


def ranked(caps: dict[str, Capacity]) -> list[str]:
    """Strategies from the most sustained traffic to the least; equal capacity (none included):
    the higher mean SLO attainment first, then the config's order."""
    order = list(caps)
    return sorted(order, key=lambda s: (-(caps[s].rate if caps[s].rate is not None else -1), -caps[s].attainment,
                                        order.index(s)))


def telling_rate(caps: dict[str, Capacity], better: str, rates: list[float]) -> float:
    """The rate a pair is compared at, fixed in advance: the highest tested rate where the better
    strategy still sustains its traffic (the lowest tested rate when it sustains none). NOTE: not
    the rate of the largest gain, which picks a point where the other side has collapsed."""
    knee = caps[better].rate
    below = [r for r in sorted(rates) if knee is not None and r <= knee]
    return float(below[-1] if below else min(rates))
