"""Queueing theory beside what was measured, and the four hypotheses of a batching comparison
answered from the run.

Theory, per rate (λ req/s), where the strategies ran:
- naive batching waits for N requests: at low load (the backend idle when a batch fills) a
  request waits on average (N − 1) / (2λ) for the rest of its batch to arrive;
- dynamic batching launches when the cap fills or the oldest has waited max_wait: a batch holds
  about min(1 + λ · max_wait, cap) requests (the first, and those arriving during its wait);
- Little's law, L = λW, for every strategy (the driver's own count against arrivals × time in system).

The hypotheses, each "holds", "does not hold" or "not tested here", with its figures:
- H1: at low load naive's TTFT is long while the others start at once (here: naive's median TTFT
  at the lowest rate is at least twice every other strategy's);
- H2: at high load naive and dynamic reach about the same throughput (within 10 % at the highest rate);
- H3: vLLM leads on throughput and tail latency and its knee lies furthest right;
- H4: the comparison names its rate (the verdict's sentence on dynamic against naive says at what rate).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchlab.report import fmt, stats
from batchlab.report import timeline as tl
from batchlab.report.capacity import Capacity
from batchlab.report.load import config_value

LONG = 2.0              # H1: naive's median TTFT over another's that counts as "long against at once"
SAME = 0.10             # H2: throughputs within this share are "about the same"
NAIVE, DYNAMIC = "naive", "dynamic"


def theory_lines(summary: pd.DataFrame, requests: pd.DataFrame | None, config: dict) -> list[str]:
    """A table per rate: each formula's value beside the measured one."""
    med = stats.medians(summary)
    if config_value(config, "traffic.arrival") == "closed":
        return _closed_theory(med)
    names = set(med["strategy"])
    n, wait_ms, cap = (config_value(config, k) for k in ("naive.batch_size", "dynamic.max_wait_ms",
                                                           "dynamic.max_batch_size"))
    measured = requests[~requests["warmup"].astype(bool) & (requests["status"] == "finished")] if requests is not None else None
    sizes = tl.useful_work(tl.batches(measured)) if measured is not None and len(measured) else pd.DataFrame()
    md = ["## Theory beside measurement", "",
          "Per rate λ: naive's expected wait for its batch to fill, (N − 1) / (2λ), against the measured mean wait "
          "for a trigger; dynamic's expected batch, min(1 + λ · max_wait, cap), against the mean batch it launched. "
          "Both formulas assume the backend idle when a batch forms (low load): once batches queue behind a busy "
          "backend, requests wait for it instead (naive's wait for a trigger falls towards 0) and pile up "
          "(dynamic's batches grow past the formula). Little's law, the mean number in the system L over λW per "
          "strategy, is 1 in a steady state; past capacity the queue grows and it departs from 1.", "",
          "| rate | naive wait: (N−1)/(2λ) | measured | dynamic batch: min(1+λ·w, cap) | measured | L / λW per strategy |",
          "|---|---|---|---|---|---|"]
    for rate, rows in med.groupby("rate"):
        naive = dynamic = measured_wait = measured_batch = "—"
        if NAIVE in names and n:
            naive = fmt.seconds((n - 1) / (2 * rate))
            if measured is not None:
                w = measured[(measured["strategy"] == NAIVE) & (measured["rate"] == rate)]["wait_trigger"].astype(float)
                measured_wait = fmt.seconds(w.mean()) if len(w) else "—"
        if DYNAMIC in names and wait_ms is not None and cap:
            dynamic = fmt.num(min(1 + rate * wait_ms / 1e3, cap))
            got = sizes[(sizes["strategy"] == DYNAMIC) & (sizes["rate"] == rate)] if len(sizes) else sizes
            measured_batch = fmt.num(float(got["mean_batch"].iloc[0])) if len(got) else "—"
        little = ", ".join(f"{r['strategy']} {_ratio(r)}" for _, r in rows.iterrows())
        md.append(f"| {fmt.rate(rate)} | {naive} | {measured_wait} | {dynamic} | {measured_batch} | {little} |")
    return md + [""]


def _closed_theory(med: pd.DataFrame) -> list[str]:
    """A closed loop's theory is Little's law alone: N users = X · W, X the requests finished per
    second and W the mean time in system; naive's and dynamic's formulas assume arrivals that do
    not wait for answers, which a closed loop's never do."""
    md = ["## Theory beside measurement", "",
          "In a closed loop the load is N users, each sending its next request when its answer ends, so the "
          "arrival rate is whatever the backend lets them send: naive's and dynamic's formulas, which assume "
          "arrivals independent of answers, do not apply. Little's law does: N = X · W, with X the requests "
          "completed per second and W the mean time in system, so throughput can only rise with N by as much "
          "as latency does not. The mean number of requests in the system, L (the driver's own count, or the "
          "stamps' for a server), must equal N: nobody sends a second request before the first is answered. "
          "L over λW per strategy is 1 in a steady state.", "",
          "| users N | L per strategy (N expected) | L / λW per strategy |", "|---|---|---|"]
    for users, rows in med.groupby("rate"):
        held = ", ".join(f"{r['strategy']} {fmt.num(r['little_L'])}" for _, r in rows.iterrows())
        little = ", ".join(f"{r['strategy']} {_ratio(r)}" for _, r in rows.iterrows())
        md.append(f"| {fmt.num(users)} | {held} | {little} |")
    return md + [""]


def _ratio(row: pd.Series) -> str:
    L, lw = row.get("little_L"), row.get("little_lambda_W")
    return f"{L / lw:.2f}" if L is not None and lw and not math.isnan(L) and not math.isnan(lw) else "—"


def hypotheses(summary: pd.DataFrame, caps: dict[str, Capacity], verdict: list[str]) -> list[tuple[str, str, str]]:
    """(hypothesis, "holds" / "does not hold" / "not tested here", the figures or why)."""
    med = stats.medians(summary)
    names = list(dict.fromkeys(med["strategy"]))
    return [_h1(med, names), _h2(med, names), _h3(med, names, caps), _h4(names, verdict)]


def _at(med: pd.DataFrame, strategy: str, rate: float, metric: str) -> float:
    row = med[(med["strategy"] == strategy) & (med["rate"] == rate)]
    return float(row[metric].iloc[0]) if len(row) else math.nan


def _h1(med, names):
    text = "H1: at low load naive's TTFT is long while the others start at once"
    others = [s for s in names if s != NAIVE]
    if NAIVE not in names or not others:
        return text, "not tested here", "it needs naive batching and another strategy"
    low = float(med["rate"].min())
    naive = _at(med, NAIVE, low, "ttft_p50")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = {s: float(np.float64(naive) / _at(med, s, low, "ttft_p50")) for s in others}
    if any(math.isnan(r) for r in ratios.values()):
        return text, "not tested here", f"at {fmt.rate(low)} a strategy has no median TTFT (no request finished)"
    ok = all(r >= LONG for r in ratios.values())
    figures = (f"at {fmt.rate(low)}, naive's median TTFT is {fmt.seconds(naive)}, "
               + ", ".join(f"{_times(r)} {s}'s" for s, r in ratios.items()) + f" (holds at {LONG:g}× or more)")
    return text, "holds" if ok else "does not hold", figures


def _times(r: float) -> str:
    """A ratio for people: 8.6×, or ∞× where the other's TTFT is infinite (its requests failed)."""
    return "∞×" if math.isinf(r) else f"{r:.1f}×"


def _h2(med, names):
    text = "H2: at high load naive and dynamic reach about the same throughput"
    if NAIVE not in names or DYNAMIC not in names:
        return text, "not tested here", "it needs naive and dynamic batching"
    high = float(med["rate"].max())
    a, b = _at(med, DYNAMIC, high, "throughput_tok_s"), _at(med, NAIVE, high, "throughput_tok_s")
    diff = a / b - 1 if b else math.nan
    if math.isnan(diff):
        return text, "not tested here", f"at {fmt.rate(high)} naive served no tokens to compare with"
    return (text, "holds" if abs(diff) <= SAME else "does not hold",
            f"at {fmt.rate(high)}, dynamic {fmt.num(a)} and naive {fmt.num(b)} output tok/s: {fmt.change(diff)} "
            f"(holds within ±{SAME:.0%})")


def _h3(med, names, caps):
    text = "H3: vLLM leads on throughput and tail latency, and its knee lies furthest right"
    vllm = next((s for s in names if "vllm" in s.lower()), None)
    if vllm is None:
        return text, "not tested here", "no vLLM strategy in this run"
    high = float(med[med["strategy"] == vllm]["rate"].max())
    at = med[med["rate"] == high]
    if at["throughput_tok_s"].isna().all() or at["e2e_p99"].isna().all():
        return text, "not tested here", f"at {fmt.rate(high)} no strategy finished a request"
    lead_thr = at.loc[at["throughput_tok_s"].idxmax(), "strategy"] == vllm
    lead_tail = at.loc[at["e2e_p99"].idxmin(), "strategy"] == vllm
    knees = {s: (c.rate if c.rate is not None else -1) for s, c in caps.items()}
    furthest = knees[vllm] >= max(knees.values())
    ok = lead_thr and lead_tail and furthest
    return (text, "holds" if ok else "does not hold",
            f"at {fmt.rate(high)}: most throughput {'yes' if lead_thr else 'no'}, lowest p99 E2E "
            f"{'yes' if lead_tail else 'no'}; knee furthest right {'yes' if furthest else 'no'}")


def _h4(names, verdict):
    text = "H4: the comparison names its rate"
    if NAIVE not in names or DYNAMIC not in names:
        return text, "not tested here", "it needs naive and dynamic batching"
    line = next((x for x in verdict if x.startswith("Dynamic batching") and "naive" in x), None)
    if line is None:
        return text, "does not hold", "the verdict has no sentence on dynamic against naive"
    return text, "holds" if " at " in line else "does not hold", f"“{line}”"


def hypothesis_lines(summary: pd.DataFrame, caps: dict[str, Capacity], verdict: list[str]) -> list[str]:
    md = ["## Four hypotheses", "", "| hypothesis | answer | figures |", "|---|---|---|"]
    md += [f"| {h} | **{a}** | {f} |" for h, a, f in hypotheses(summary, caps, verdict)]
    return md + [""]
