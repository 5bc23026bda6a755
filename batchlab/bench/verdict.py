"""The one-line verdict: how a strategy compares with a baseline, naming the arrival rate.

"Dynamic batching improved throughput by +X% and cut p50 E2E latency by -Y% vs naive at
20 req/s on <device> with <model>." Medians over repeats; the paired statistics that decide
what may be claimed live in bench/stats.py.
"""
from __future__ import annotations

import pandas as pd

NAMES = {"naive": "Naive", "dynamic": "Dynamic", "continuous": "Continuous"}


def _pct(new: float, old: float) -> float:
    return (new - old) / old * 100.0 if old else float("nan")


def compare_line(summary: pd.DataFrame, strategy: str, baseline: str, rate: float, setup: dict) -> str | None:
    """One sentence comparing medians over repeats of two strategies at one rate."""
    at = summary[summary["rate"] == rate].groupby("strategy").median(numeric_only=True)
    if strategy not in at.index or baseline not in at.index:
        return None
    s, b = at.loc[strategy], at.loc[baseline]
    thr = _pct(s["throughput_tok_s"], b["throughput_tok_s"])
    lat = _pct(s["e2e_p50"], b["e2e_p50"])
    thr_word = "improved" if thr >= 0 else "reduced"
    lat_word = "cut" if lat <= 0 else "raised"
    where = " on " + setup.get("device", "?") if setup.get("device") else ""
    model = setup.get("model")
    with_model = f" with {model}" if model and model not in where else ""
    return (f"{NAMES.get(strategy, strategy)} batching {thr_word} throughput by {thr:+.0f}% and "
            f"{lat_word} p50 E2E latency by {lat:+.0f}% vs {baseline} at {rate:g} req/s{where}{with_model}.")


def headline_rate(summary: pd.DataFrame, strategy: str, baseline: str) -> float:
    """The rate to name: where the strategy's p50 E2E advantage over the baseline is largest
    while the strategy itself still keeps up (throughput within 10% of its best)."""
    med = summary.groupby(["strategy", "rate"]).median(numeric_only=True)
    rates = sorted(set(summary["rate"]))
    best = None
    for rate in rates:
        if (strategy, rate) not in med.index or (baseline, rate) not in med.index:
            continue
        gain = med.loc[(baseline, rate), "e2e_p50"] / med.loc[(strategy, rate), "e2e_p50"]
        if best is None or gain > best[0]:
            best = (gain, rate)
    return best[1] if best else rates[len(rates) // 2]


def verdict_lines(summary: pd.DataFrame, setup: dict) -> list[str]:
    """The headline first (dynamic vs naive, the seed's question), then the other pairs per rate."""
    strategies = list(dict.fromkeys(summary["strategy"]))
    pairs = [(s, b) for s, b in (("dynamic", "naive"), ("continuous", "dynamic"), ("continuous", "naive"))
             if s in strategies and b in strategies]
    lines = []
    for s, b in pairs:
        line = compare_line(summary, s, b, headline_rate(summary, s, b), setup)
        if line:
            lines.append(line)
    return lines
