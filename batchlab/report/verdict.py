"""The one-line verdict: how a strategy compares with a baseline, naming the arrival rate.

"Dynamic batching improved throughput by +X% and reduced p50 E2E latency by −Y% compared to
naive batching at 20 req/s on <device> with <model>." Each claim carries its interval from the
paired comparison (report/stats.py): a change whose interval includes zero is reported as "no
measurable difference", and a number without an interval says so. The rate named is the one
where the p50 E2E gain is largest among supported gains; the report gives every other rate too.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from batchlab.report import stats

NAMES = {"naive": "Naive", "dynamic": "Dynamic", "continuous": "Continuous", "server": "Server-side"}
PAIRS = (("dynamic", "naive"), ("continuous", "dynamic"), ("continuous", "naive"))


def pairs(strategies: list[str]) -> list[tuple[str, str]]:
    """The seed's question first (dynamic vs naive), then the others present in the results."""
    found = [(a, b) for a, b in PAIRS if a in strategies and b in strategies]
    rest = [(a, b) for i, b in enumerate(strategies) for a in strategies[i + 1:] if (a, b) not in found
            and (b, a) not in found]
    return found + rest


def pct(x: float) -> str:
    if not np.isfinite(x):
        return "—"                   # relative to zero (e.g. a goodput of 0): no percentage
    return f"{round(100 * x):+d}%".replace("-", "−")   # NOTE: round() first, so -0.4% prints +0%


def headline_rate(cmp: pd.DataFrame) -> float:
    """Where a's p50 E2E gain over b is largest, preferring gains the interval supports."""
    e2e = cmp[cmp["metric"] == "e2e_p50"].dropna(subset=["rel"])
    if e2e.empty:
        rates = sorted(cmp["rate"].unique())
        return float(rates[len(rates) // 2])
    supported = e2e[e2e["supported"] | ~e2e["low"].notna()]
    pool = supported if not supported.empty else e2e
    return float(pool.loc[pool["rel"].idxmin(), "rate"])


def claim(row: pd.Series, what: str, up: str, down: str) -> str:
    """'improved throughput by +36% (95% CI ...)' or 'showed no measurable difference in ...'."""
    iv = f"{pct(row['rel_low'])} to {pct(row['rel_high'])}" if pd.notna(row["rel_low"]) else ""
    how = str(row["method"])
    if pd.isna(row["low"]):
        if abs(row["rel"]) < stats.TIE:
            return f"left {what} about the same ({pct(row['rel'])}, {how}: no interval)"
        word = up if row["estimate"] > 0 else down
        return f"{word} {what} by {pct(row['rel'])} ({how}: no interval)"
    if not row["supported"]:
        return f"showed no measurable difference in {what} ({pct(row['rel'])}, 95% CI {iv}, {how})"
    word = up if row["estimate"] > 0 else down
    return f"{word} {what} by {pct(row['rel'])} (95% CI {iv}, {how})"


def where(setup: dict) -> str:
    device, model = setup.get("gpu") or setup.get("device"), setup.get("model")
    if setup.get("dtype") == "simulated":
        return f" in simulation ({device})" if device else " in simulation"
    text = f" on {device}" if device else ""
    return text + (f" with {model}" if model and model not in text else "")


def compare_line(cmp: pd.DataFrame, a: str, b: str, rate: float, setup: dict,
                 past: set[tuple[str, float]] = frozenset()) -> str | None:
    at = cmp[cmp["rate"] == rate].set_index("metric")
    if not {"throughput_tok_s", "e2e_p50"} <= set(at.index):
        return None
    thr = claim(at.loc["throughput_tok_s"], "throughput", "improved", "reduced")
    lat = claim(at.loc["e2e_p50"], "p50 E2E latency", "raised", "reduced")
    over = [s for s in (a, b) if (s, float(rate)) in past]
    caveat = (f"; {' and '.join(over)} {'were' if len(over) > 1 else 'was'} past capacity there, so "
              f"{'their' if len(over) > 1 else 'its'} latencies grow with the run's length") if over else ""
    return (f"{NAMES.get(a, a.title())} batching {thr} and {lat} compared to {b} batching "
            f"at {rate:g} req/s{where(setup)}{caveat}.")



def knee_line(summary: pd.DataFrame, slo: dict) -> str | None:
    if not any(slo.get(k) for k in ("ttft_s", "tpot_s", "e2e_s")):
        return None
    parts = []
    for s in dict.fromkeys(summary["strategy"]):
        k = stats.knee(summary, s)
        parts.append(f"{s} {k:g} req/s" if k is not None else f"{s} none of the tested rates")
    slo_text = ", ".join(f"{k.removesuffix('_s').upper()} ≤ {v:g} s" for k, v in slo.items() if v)
    return (f"Knee (highest tested rate where ≥ {100 * stats.ATTAINMENT:.0f}% of requests meet "
            f"{slo_text}): " + "; ".join(parts) + ".")


def crossover_lines(summary: pd.DataFrame, pairs_: list[tuple[str, str]]) -> list[str]:
    out = []
    for a, b in pairs_:
        for c in stats.crossovers(summary, a, b):
            out.append(f"{c.leader_after} overtakes {c.leader_before} on {c.metric} at about {c.rate:.3g} req/s.")
    return out


def verdict_lines(summary: pd.DataFrame, setup: dict, comparisons: dict[tuple[str, str], pd.DataFrame] | None = None,
                  slo: dict | None = None, past: set[tuple[str, float]] | None = None) -> list[str]:
    """Headline per pair (each at its own rate), then knees and crossovers."""
    strategies = list(dict.fromkeys(summary["strategy"]))
    comparisons = comparisons if comparisons is not None else {p: stats.compare(summary, None, *p) for p in pairs(strategies)}
    past = past if past is not None else stats.past_capacity(summary, None)
    lines = []
    for (a, b), cmp in comparisons.items():
        if not cmp.empty:
            line = compare_line(cmp, a, b, headline_rate(cmp), setup, past)
            if line:
                lines.append(line)
    knee = knee_line(summary, slo or {})
    return lines + ([knee] if knee else []) + crossover_lines(summary, list(comparisons))
