"""The one-line verdict: how a strategy compares with a baseline, naming the arrival rate.

"Dynamic batching improved throughput by +X% and reduced p50 E2E latency by −Y% compared to
naive batching at 20 req/s on <device> with <model>." Each claim carries its interval from the
paired comparison (report/stats.py): a change whose interval includes zero is reported as "no
measurable difference", and a number without an interval says so. The rate named is the one
where the p50 E2E gain is largest among supported gains; the report gives every other rate too.
Failures come first: a strategy that failed every request is named with the recorded reason,
a side with more failures is never called faster, and any failure counts are named. A sentence
never shows "nan", "inf" or a dash for a number: what cannot be compared says so in words.
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
    """Where a's p50 E2E gain over b is largest, preferring gains the interval supports, among
    rates where both sides finished something (else the middle rate: nothing to compare)."""
    e2e = cmp[(cmp["metric"] == "e2e_p50") & np.isfinite(cmp["rel"].astype(float))]
    e2e = e2e[[_comparable(r) for _, r in e2e.iterrows()]]
    if e2e.empty:
        rates = sorted(cmp["rate"].unique())
        return float(rates[len(rates) // 2])
    supported = e2e[e2e["supported"] | ~e2e["low"].notna()]
    pool = supported if not supported.empty else e2e
    return float(pool.loc[pool["rel"].idxmin(), "rate"])


def _comparable(row: pd.Series) -> bool:
    """Both sides finished at least one request (unknown counts: assume so)."""
    return all(row.get(f"{k}_finished", 1) > 0 or row.get(f"{k}_requests", 0) == 0 for k in "ab")


def _bound(x: float) -> str:
    return pct(x) if np.isfinite(x) else "unbounded"


def claim(row: pd.Series, what: str, up: str, down: str) -> str:
    """'improved throughput by +36% (95% CI ...)' or 'showed no measurable difference in ...'."""
    a_val, b_val = row.get("a_value", 0.0), row.get("b_value", 0.0)
    if np.isinf(a_val) or np.isinf(b_val):       # failed requests reach this percentile
        who = "both strategies'" if np.isinf(a_val) and np.isinf(b_val) else f"{row.get('a' if np.isinf(a_val) else 'b')}'s"
        return f"could not compare {what}: {who} failed requests reach it"
    rel, how = row["rel"], str(row["method"])
    if not np.isfinite(rel):
        if not (np.isfinite(a_val) and np.isfinite(b_val) and np.isfinite(row["estimate"])):
            return f"could not compare {what}"
        word = up if row["estimate"] > 0 else down
        return f"{word} {what} from {b_val:.3g} to {a_val:.3g}"
    if row.get("note"):
        return f"showed {pct(rel)} {what}, but {row['note']}, so it is not called faster"
    iv = f"{_bound(row['rel_low'])} to {_bound(row['rel_high'])}" if pd.notna(row["rel_low"]) else ""
    if pd.isna(row["low"]):
        if abs(rel) < stats.TIE:
            return f"left {what} about the same ({pct(rel)}, {how}: no interval)"
        word = up if row["estimate"] > 0 else down
        return f"{word} {what} by {pct(rel)} ({how}: no interval)"
    if not row["supported"]:
        return f"showed no measurable difference in {what} ({pct(rel)}, 95% CI {iv}, {how})"
    word = up if row["estimate"] > 0 else down
    return f"{word} {what} by {pct(rel)} (95% CI {iv}, {how})"


def where(setup: dict) -> str:
    device, model = setup.get("gpu") or setup.get("device"), setup.get("model")
    if setup.get("dtype") == "simulated":
        return f" in simulation ({device})" if device else " in simulation"
    text = f" on {device}" if device else ""
    return text + (f" with {model}" if model and model not in text else "")


def compare_line(cmp: pd.DataFrame, a: str, b: str, rate: float, setup: dict,
                 past: set[tuple[str, float]] = frozenset()) -> str | None:
    """The pair's sentence at `rate`; None where there is nothing to compare (a side failed
    every request there: `failure_lines` says so)."""
    at = cmp[cmp["rate"] == rate].set_index("metric")
    if not {"throughput_tok_s", "e2e_p50"} <= set(at.index) or not _comparable(at.loc["e2e_p50"]):
        return None
    thr = claim(at.loc["throughput_tok_s"], "throughput", "improved", "reduced")
    lat = claim(at.loc["e2e_p50"], "p50 E2E latency", "raised", "reduced")
    over = [s for s in (a, b) if (s, float(rate)) in past]
    caveat = (f"; {' and '.join(over)} {'were' if len(over) > 1 else 'was'} past capacity there, so "
              f"{'their' if len(over) > 1 else 'its'} latencies grow with the run's length") if over else ""
    return (f"{NAMES.get(a, a.title())} batching {thr} and {lat} compared to {b} batching "
            f"at {rate:g} req/s{where(setup)}{caveat}{_failure_counts(at.loc['e2e_p50'], a, b)}.")


def _failure_counts(row: pd.Series, a: str, b: str) -> str:
    """'; failed requests: dynamic 0 of 600, naive 12 of 600' when either side failed any."""
    if not (row.get("a_failed", 0) or row.get("b_failed", 0)):
        return ""
    return (f"; failed requests: {a} {int(row['a_failed'])} of {int(row['a_requests'])}, "
            f"{b} {int(row['b_failed'])} of {int(row['b_requests'])}")


def failure_lines(summary: pd.DataFrame) -> list[str]:
    """'naive failed every request: <the recorded reason>', for each strategy that finished
    nothing at some tested rate (naming those rates unless it was every one)."""
    if not {"finished", "num_requests"} <= set(summary.columns):
        return []
    out = []
    for s, rows in summary.groupby("strategy", sort=False):
        per_rate = rows.groupby("rate")[["finished", "num_requests"]].sum()
        dead = per_rate[(per_rate["finished"] == 0) & (per_rate["num_requests"] > 0)].index
        if dead.empty:
            continue
        at = "" if len(dead) == len(per_rate) else " at " + _and([f"{r:g}" for r in sorted(dead)]) + " req/s"
        errors = rows[rows["rate"].isin(dead)].get("top_error", pd.Series(dtype=object)).dropna()
        errors = errors[errors.astype(str).str.len() > 0]
        why = errors.astype(str).mode().iloc[0] if len(errors) else "no reason recorded (see requests.csv)"
        out.append(f"{s} failed every request{at}: {why}.")
    return out


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


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
    """Strategies that failed every request, a headline per pair (each at its own rate), then
    knees and crossovers."""
    strategies = list(dict.fromkeys(summary["strategy"]))
    comparisons = comparisons if comparisons is not None else {p: stats.compare(summary, None, *p) for p in pairs(strategies)}
    past = past if past is not None else stats.past_capacity(summary, None)
    lines = failure_lines(summary)
    for (a, b), cmp in comparisons.items():
        if not cmp.empty:
            line = compare_line(cmp, a, b, headline_rate(cmp), setup, past)
            if line:
                lines.append(line)
    knee = knee_line(summary, slo or {})
    return lines + ([knee] if knee else []) + crossover_lines(summary, list(comparisons))
