"""The verdict: first the answer (what each strategy sustains under the SLO), then the evidence.

"Continuous sustains 20 req/s within TTFT ≤ 1 s and TPOT ≤ 50 ms; dynamic 5; naive none — 4×
more traffic than dynamic" (report/capacity.py decides "sustains"). Then one sentence per pair,
the better one first: "Continuous batching improved throughput by +X% and reduced p50 E2E latency
by −Y% compared to dynamic batching at 20 req/s on <device>". Each claim carries its interval
from the paired comparison (report/stats.py): a change whose interval includes zero is reported
as "no measurable difference", and a number without an interval says so. The rate named is fixed
in advance (capacity.telling_rate): the highest one where the better strategy still sustains.
Failures count: a strategy that failed every request is named with the recorded reason,
a side with more failures is never called faster, and any failure counts are named. A sentence
never shows "nan", "inf" or a dash for a number: what cannot be compared says so in words.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from batchlab.report import capacity, fmt, stats
from batchlab.report.capacity import Capacity
from batchlab.run.strategies import info


def _comparable(row: pd.Series) -> bool:
    """Both sides finished at least one request (unknown counts: assume so)."""
    return all(row.get(f"{k}_finished", 1) > 0 or row.get(f"{k}_requests", 0) == 0 for k in "ab")


def _bound(x: float) -> str:
    return fmt.change(x) if np.isfinite(x) else "unbounded"


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
        return f"{word} {what} from {fmt.num(b_val)} to {fmt.num(a_val)}"
    if row.get("note"):
        return f"showed {fmt.change(rel)} {what}, but {row['note']}, so it is not called faster"
    iv = f"{_bound(row['rel_low'])} to {_bound(row['rel_high'])}" if pd.notna(row["rel_low"]) else ""
    if pd.isna(row["low"]):
        if abs(rel) < stats.TIE:
            return f"left {what} about the same ({fmt.change(rel)}, {how}: no interval)"
        word = up if row["estimate"] > 0 else down
        return f"{word} {what} by {fmt.change(rel)} ({how}: no interval)"
    if not row["supported"]:
        return f"showed no measurable difference in {what} ({fmt.change(rel)}, 95% CI {iv}, {how})"
    word = up if row["estimate"] > 0 else down
    return f"{word} {what} by {fmt.change(rel)} (95% CI {iv}, {how})"


def where(setup: dict) -> str:
    device, model = setup.get("gpu") or setup.get("device"), setup.get("model")
    if setup.get("dtype") == "simulated":
        return f" in simulation ({device})" if device else " in simulation"
    text = f" on {device}" if device else ""
    return text + (f" with {model}" if model and model not in text else "")


def compare_line(cmp: pd.DataFrame, a: str, b: str, rate: float, setup: dict,
                 past: set[tuple[str, float]] = frozenset(), step: dict | None = None) -> str | None:
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
    return (f"{info(a).opening} {thr} and {lat} compared to {info(b).batching} "
            f"at {fmt.rate(rate)}{_burst_text(step).removesuffix(',')}{where(setup)}{caveat}{_failure_counts(at.loc['e2e_p50'], a, b)}.")


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
        at = "" if len(dead) == len(per_rate) else " at " + fmt.listing([fmt.num(r) for r in sorted(dead)]) + " " + fmt.RATE_UNIT.get()
        errors = rows[rows["rate"].isin(dead)].get("top_error", pd.Series(dtype=object)).dropna()
        errors = errors[errors.astype(str).str.len() > 0]
        why = errors.astype(str).mode().iloc[0] if len(errors) else "no reason recorded (see requests.csv)"
        out.append(f"{s} failed every request{at}: {why}.")
    return out


def slo_text(slo: dict) -> str:
    """'TTFT ≤ 1 s and TPOT ≤ 50 ms'."""
    return fmt.listing([f"{name} ≤ {fmt.seconds(slo[k])}" for k, name in capacity.SLO_METRICS.items() if slo.get(k)])


def headline(caps: dict[str, Capacity], slo: dict, step: dict | None = None) -> str:
    """The answer first: 'Continuous sustains 20 req/s within TTFT ≤ 1 s and TPOT ≤ 50 ms;
    dynamic 5; naive none — 4× more traffic than dynamic.' A burst run (traffic.rate_step) says
    that the rates named carry the burst."""
    order = capacity.ranked(caps)
    within = (f"within {slo_text(slo)}" if slo_text(slo) else
              f"with no SLO set (serving ≥ {fmt.share(capacity.SERVED)} of the offered requests/s)")
    best = caps[order[0]]
    if best.rate is None:
        every = "both" if len(order) == 2 else "all"
        return f"No strategy sustains even the lowest tested rate {within}: {fmt.listing(order)} {every} miss it."

    def at(c: Capacity, unit: str = "") -> str:
        if c.rate is None:
            return "none"
        return f"≥ {fmt.num(c.rate)}{unit} (highest tried)" if c.highest_tried else f"{fmt.num(c.rate)}{unit}"
    lead = info(best.strategy).short
    text = f"{lead} sustains {at(best, ' ' + fmt.RATE_UNIT.get())}{_burst_text(step)} {within}"
    text += "".join(f"; {s} {at(caps[s])}" for s in order[1:])
    return text + _lead(best, [caps[s] for s in order[1:]]) + "."


def _burst_text(step: dict | None) -> str:
    """' with a burst to 25 req/s from 40 s to 50 s,'."""
    if not step:
        return ""
    until = f" to {fmt.num(step['until_s'])} s" if step.get("until_s") else " on"
    return f" with a burst to {fmt.rate(step['to_rate'])} from {fmt.num(step['at_s'])} s{until},"


def short_line(duration_s: float | None) -> str | None:
    """A caveat when points are too short for a growing queue to show (under MIN_DURATION_S)."""
    if duration_s is None or duration_s >= capacity.MIN_DURATION_S:
        return None
    return (f"Each point measured {fmt.num(duration_s)} s of traffic; under {fmt.num(capacity.MIN_DURATION_S)} s a "
            "queue that grows slowly may not show yet, so a capacity found here may be overstated.")


def burst_line(rows: list, step: dict | None) -> str | None:
    """'Burst to 25 req/s at 40–50 s: continuous peak queue 5 (2 before), back to its pre-burst
    p99 TTFT 4 s after, 0 s violating the SLO; dynamic ...' (report/timeline.py measures these)."""
    if not rows or not step:
        return None
    parts = []
    for b in rows:
        rec = (f"back to its pre-burst p99 TTFT {fmt.num(b.recovery_s)} s after" if b.recovery_s is not None
               else "not back to its pre-burst p99 TTFT by the end of the run" if np.isfinite(b.baseline_p99_ttft)
               else "no pre-burst request finished")
        slo = "" if b.violating_s is None else f", {fmt.num(b.violating_s)} s violating the SLO"
        parts.append(f"{b.strategy} peak queue {b.peak_queue} ({b.peak_queue_before} before), {rec}{slo}")
    return f"Burst{_burst_text(step).removeprefix(' with a burst').removesuffix(',')}: " + "; ".join(parts) + "."


def _lead(best: Capacity, rest: list[Capacity]) -> str:
    """' — 4× more traffic than dynamic', or why there is no ratio."""
    if not rest:
        return ""
    second = rest[0]
    if second.rate is None:
        return " — the only strategy that sustains any tested rate"
    if second.rate == best.rate:
        tied = [c.strategy for c in rest if c.rate == best.rate]
        return f" — the same as {fmt.listing(tied)} on this grid of rates"
    lower = "at least " if best.highest_tried else ""
    return f" — {lower}{fmt.ratio(best.rate / second.rate)} more traffic than {second.strategy}"


def limits_line(caps: dict[str, Capacity]) -> str | None:
    """'What each misses first: continuous TPOT at 50 req/s; dynamic TTFT at 20 req/s.'"""
    parts = [f"{c.strategy} {fmt.listing(list(c.limit))} at {fmt.rate(c.broke_at)}"
             for s in capacity.ranked(caps) if (c := caps[s]).broke_at is not None and c.limit]
    return f"What each misses first: {'; '.join(parts)}." if parts else None


def ranked_pairs(caps: dict[str, Capacity]) -> list[tuple[str, str]]:
    """Every pair, the strategy that sustains more first (ties keep the config's order). With
    FCFS continuous batching in the run, a policy on its machinery (priority, sjf, vtc, your own)
    is compared with it alone, not with every other policy: that is the question it answers."""
    order = capacity.ranked(caps)
    pairs = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]]
    anchors = {info(s).compared_with for s in order} & set(order)
    if not anchors:
        return pairs
    policy = lambda s: info(s).compared_with is not None   # noqa: E731
    return [(a, b) for a, b in pairs if not (policy(a) or policy(b)) or anchors & {a, b}]


def crossover_lines(summary: pd.DataFrame, pairs_: list[tuple[str, str]]) -> list[str]:
    out = []
    for a, b in pairs_:
        for c in stats.crossovers(summary, a, b):
            out.append(f"{c.leader_after} overtakes {c.leader_before} on {c.metric} at about {fmt.rate(c.rate)}.")
    return out


def verdict_lines(summary: pd.DataFrame, setup: dict, comparisons: dict[tuple[str, str], pd.DataFrame] | None = None,
                  slo: dict | None = None, past: set[tuple[str, float]] | None = None,
                  caps: dict[str, Capacity] | None = None, burst: list | None = None,
                  step: dict | None = None, duration_s: float | None = None) -> list[str]:
    """The headline (capacity under the SLO), strategies that failed every request, one sentence
    per pair (the better first, at the rate capacity.telling_rate fixes), what breaks each knee,
    then crossovers. `comparisons` keys must be ordered better-first (see ranked_pairs)."""
    slo = slo or {}
    caps = caps if caps is not None else capacity.capacities(summary, None, slo)
    if comparisons is None:
        comparisons = {p: stats.compare(summary, None, *p) for p in ranked_pairs(caps)}
    past = past if past is not None else stats.past_capacity(summary, None)
    lines = [headline(caps, slo, step)] + [line for line in [burst_line(burst or [], step), short_line(duration_s)] if line]
    lines += failure_lines(summary)
    for (a, b), cmp in comparisons.items():
        if not cmp.empty:
            line = compare_line(cmp, a, b, capacity.telling_rate(caps, a, list(cmp["rate"].unique())), setup, past, step)
            if line:
                lines.append(line)
    limits = limits_line(caps)
    return lines + ([limits] if limits else []) + crossover_lines(summary, list(comparisons))
