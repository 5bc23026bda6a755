"""How far the simulator is from the machine, and how far the machine is from itself.

A *cell* is one metric of one trace (workload x strategy x rate x repeat), or of one saturation
burst. Each cell holds the first real run (`real`, the reference), a second real run of the same
trace (`real_b`), the calibrated simulator's replay (`sim`) and two more replays with every step
cost scaled by (1 - s) and (1 + s), where s is the profile fit's relative RMS error (`sim_lo`,
`sim_hi`). From those, with no further fitting:

    error        (sim - real) / real                   what the simulator gets wrong
    noise        (real_b - real) / real                what the machine gets wrong on a rerun
    interval     sim +- z * sqrt(model^2 + run^2)      90 %: z = 1.645
                 model = (sim_hi - sim_lo) / 2         the metric's spread under a 1-sigma step-cost error
                 run   = sim * rms(noise) / sqrt(2)    one run's spread, pooled over the metric's cells

NOTE: the difference of two runs has twice one run's variance, hence the sqrt(2). A perfect
simulator (the expected value) would read about 0.7x the noise floor, not zero: the reference is one
run, not the mean.

That interval (`step-cost`) moves every step coherently by the fit's relative RMS error, which is
mostly the scatter of single timed steps, not an error every step shares. The other rule
(`held-out`) reads the width from what the simulator missed on the *other* workloads of the same
validation, so no cell sizes its own interval:

    held-out     q = t(0.95, n) * rms(error of the metric over the n cells of the other workloads)
                 [sim / (1 + q), sim / (1 - q)]        (no upper bound where q >= 1)

with t Student's quantile (cells taken as independent); those errors already hold one real run's
noise each, as the judged cell's does. The bounds are those of the error, which is relative to the
real value: the interval holds the real value exactly when |error| <= q (sim +- q * sim would give a
replay above the real value more room than one below). A validation of one workload has no other:
`step-cost`.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd

LATENCY = ("e2e_p50", "ttft_p50", "tpot_p50", "ttft_p99")   # judged below capacity
SATURATION = ("throughput_tok_s",)                           # judged where the backend sets it
Z90 = 1.6448536269514722                                     # two-sided 90 %: the normal's 95th percentile
COVERAGE = (0.85, 0.95)                                      # the interval is honest if it covers this often
RULES = ("step-cost", "held-out")                            # how with_errors sizes the interval (module docstring)

# metric -> (median bound, P90 bound or None): the accuracy targets; p99 TTFT and throughput are
# reported against the noise floor alone
TARGETS = {"e2e_p50": (0.06, 0.10), "ttft_p50": (0.10, None), "tpot_p50": (0.10, None)}
FLOOR_FACTOR = 1.5             # where the machine's own noise is larger, within 1.5x of it counts
# A server's twin: metric -> median bound, met where the median error is within max(bound,
# FLOOR_FACTOR x the rerun floor's median). Looser than an engine's: the server is a black box
# whose two runs of one trace differ more, and prompt timing is read through its front end.
TWIN_TARGETS = {"e2e_p50": 0.07, "ttft_p50": 0.15, "tpot_p50": 0.07}


def cells(real: pd.DataFrame, real_b: pd.DataFrame | None, sims: dict[str, pd.DataFrame],
          key: list[str], metrics: tuple[str, ...], kind: str) -> pd.DataFrame:
    """Long format: one row per (key, metric) with real, real_b, sim, sim_lo and sim_hi.
    `sims` maps "sim", "sim_lo", "sim_hi" to summaries with the same keys as `real`."""
    out = None
    sides = {"real": real, **sims} | ({"real_b": real_b} if real_b is not None else {})
    for side, df in sides.items():
        long = df.melt(id_vars=key, value_vars=list(metrics), var_name="metric", value_name=side)
        out = long if out is None else out.merge(long, on=key + ["metric"], how="left")
    if "real_b" not in out:
        out["real_b"] = np.nan
    out.insert(0, "kind", kind)
    return out


def with_errors(table: pd.DataFrame, z: float = Z90, rule: str = "step-cost") -> pd.DataFrame:
    """`table` (from `cells`) with error, noise, the interval (by `rule`, one of RULES) and whether
    the real value is in it."""
    if rule not in RULES:
        raise ValueError(f"interval rule {rule!r}: expected one of {', '.join(RULES)}")
    t = table.copy()
    for col in ("real", "real_b", "sim", "sim_lo", "sim_hi"):
        t[col] = pd.to_numeric(t[col], errors="coerce").astype(float)
    t["error"] = (t["sim"] - t["real"]) / t["real"]
    t["noise"] = (t["real_b"] - t["real"]) / t["real"]
    run_sigma = t.groupby("metric")["noise"].transform(lambda s: _rms(s) / math.sqrt(2))
    model = (t["sim_hi"] - t["sim_lo"]).abs() / 2
    run = t["sim"].abs() * run_sigma.fillna(0.0)
    half = z * np.sqrt(model**2 + run**2)
    t["lo"], t["hi"] = t["sim"] - half, t["sim"] + half
    if rule == "held-out":
        q = _held_out_bound(t, z)
        held = q.notna()
        t.loc[held, "lo"] = t["sim"] / (1 + q)
        t.loc[held, "hi"] = (t["sim"] / (1 - q)).where(q < 1, np.inf)
    t["inside"] = (t["real"] >= t["lo"]) & (t["real"] <= t["hi"])
    return t


def _held_out_bound(t: pd.DataFrame, z: float) -> pd.Series:
    """Per cell, the `held-out` rule's bound on |error|: t(p, n) x the RMS relative error of the
    same metric over the n cells of every other workload (NaN where there are none), p the
    two-sided level `z` stands for."""
    err2 = t["error"].where(np.isfinite(t["error"])) ** 2
    ok = err2.notna()
    total_sq = err2.fillna(0.0).groupby(t["metric"]).transform("sum")
    total_n = ok.groupby(t["metric"]).transform("sum")
    own_sq = err2.fillna(0.0).groupby([t["metric"], t["workload"]]).transform("sum")
    own_n = ok.groupby([t["metric"], t["workload"]]).transform("sum")
    n = (total_n - own_n).astype(float)
    rms = np.sqrt((total_sq - own_sq) / n.where(n > 0))
    p = NormalDist().cdf(z)
    quantile = n.map(lambda k: t_quantile(p, int(k)) if k > 0 else float("nan"))
    return quantile * rms


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile at p (> 0.5) with `dof` degrees of freedom: exact for 1 and 2, else
    the Cornish-Fisher series in 1/dof (Abramowitz and Stegun 26.7.5; within 0.05 % at dof 3, the
    smallest it serves here, and closer beyond)."""
    if dof < 1:
        raise ValueError("degrees of freedom must be at least 1")
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    x = NormalDist().inv_cdf(p)
    g = ((x**3 + x) / 4, (5 * x**5 + 16 * x**3 + 3 * x) / 96, (3 * x**7 + 19 * x**5 + 17 * x**3 - 15 * x) / 384,
         (79 * x**9 + 776 * x**7 + 1482 * x**5 - 1920 * x**3 - 945 * x) / 92160)
    return x + sum(gi / dof ** (i + 1) for i, gi in enumerate(g))


def _rms(s: pd.Series) -> float:
    v = s.dropna().to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return float(np.sqrt(np.mean(v**2))) if v.size else float("nan")


def summary(table: pd.DataFrame, twin: bool = False) -> pd.DataFrame:
    """Per metric over every held-out cell: median and P90 |error|, the same of |noise|, interval
    coverage, and the target verdict (met outright, met within 1.5x the floor, or not met; for a
    server's twin, `twin_verdict`)."""
    rows = []
    for metric, g in table.groupby("metric", sort=False):
        err, noise = _finite_abs(g["error"]), _finite_abs(g["noise"])
        row = {"metric": metric, "cells": len(err),
               "error_median": _q(err, 0.5), "error_p90": _q(err, 0.9),
               "noise_median": _q(noise, 0.5), "noise_p90": _q(noise, 0.9),
               "coverage": float(g["inside"].mean()) if len(g) else float("nan")}
        row |= (twin_verdict if twin else verdict)(metric, row)
        rows.append(row)
    return pd.DataFrame(rows)


def sides(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per latency metric: the share of cells where the simulator read below the real run, the
    share above, and the cells: an error that is one-sided shows here however small its median."""
    lat = table[table["kind"] == "latency"]
    return {m: {"below": float((g["sim"] < g["real"]).mean()), "above": float((g["sim"] > g["real"]).mean()),
                "cells": len(g)} for m, g in lat.groupby("metric", sort=False)}


def by_workload(table: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Per workload and latency metric: the signed median error (simulator over real, minus 1) and
    its cells. A median over every workload can hide a residual that is one workload's: one read
    low and another high cancel in the signs, not in the error."""
    lat = table[table["kind"] == "latency"]
    return {str(w): {m: {"median_error": float(g["error"].median()), "cells": len(g)}
                     for m, g in gw.groupby("metric", sort=False)}
            for w, gw in lat.groupby("workload", sort=False)}


def verdict(metric: str, row: dict) -> dict:
    """The target for `metric`: each bound is met outright, or, where the machine's own
    noise at that percentile is larger than the bound, by an error within FLOOR_FACTOR x the noise."""
    if metric not in TARGETS:
        return {"target": "", "met": ""}
    med, p90 = TARGETS[metric]
    text = f"median <= {100 * med:g}%" + (f", P90 <= {100 * p90:g}%" if p90 else "")
    checks = [(row["error_median"], row["noise_median"], med)]
    if p90:
        checks.append((row["error_p90"], row["noise_p90"], p90))
    if all(err <= bound for err, _, bound in checks):
        return {"target": text, "met": "yes"}
    if all(err <= bound or (noise > bound and err <= FLOOR_FACTOR * noise) for err, noise, bound in checks):
        return {"target": text, "met": f"within {FLOOR_FACTOR:g}x floor"}
    return {"target": text, "met": "no"}


def twin_limit(metric: str, noise_median: float) -> float | None:
    """The median error a server twin's `metric` may reach: max(bound, FLOOR_FACTOR x the floor's
    median), or None for a metric without a target. No floor (NaN) excuses nothing."""
    bound = TWIN_TARGETS.get(metric)
    return None if bound is None else max(bound, FLOOR_FACTOR * noise_median)


def twin_verdict(metric: str, row: dict) -> dict:
    """A server twin's target for `metric` (TWIN_TARGETS): the median error within `twin_limit`."""
    limit = twin_limit(metric, row["noise_median"])
    if limit is None:
        return {"target": "", "met": ""}
    bound = TWIN_TARGETS[metric]
    return {"target": f"median <= max({100 * bound:g}%, {FLOOR_FACTOR:g}x floor) = {100 * limit:.1f}%",
            "met": "yes" if row["error_median"] <= limit else "no"}


def _finite_abs(s: pd.Series) -> np.ndarray:
    v = s.to_numpy(dtype=float)
    return np.abs(v[np.isfinite(v)])


def _q(v: np.ndarray, q: float) -> float:
    return float(np.quantile(v, q)) if v.size else float("nan")


def coverage_ok(coverage: float) -> bool:
    return COVERAGE[0] <= coverage <= COVERAGE[1]
