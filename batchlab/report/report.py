"""report.md and its plots, from a results directory's files alone (never from in-memory state).

Reads summary.csv, requests.csv, config.yaml and setup.json; writes report.md next to them with
the verdict first, then capacity and crossovers, the hypotheses answered, the plots, a table per
rate, the paired comparisons with their intervals, for a burst run how each strategy absorbed it,
the latency breakdown, useful work, theory beside measurement, and last the setup (machine,
device, model, libraries, every knob, the seed).
Every point renders whatever happened: one where nothing finished (all failed, none arrived
after warm-up) gets "—" in its cells and a line saying why, never a NaN; an inf read from a CSV
counts as missing.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from batchlab.core.files import write_atomic
from batchlab.report import capacity, classes, cost, fmt, html, hypotheses, pareto, plots, run_plots, stats
from batchlab.report import timeline as tl
from batchlab.report.capacity import Capacity
from batchlab.report.captions import CAPTIONS
from batchlab.report.load import config_value, load_requests, load_results
from batchlab.report.outcomes import finished_rows, point_outcomes
from batchlab.report.turns import turn_lines
from batchlab.report.verdict import ranked_pairs, slo_text, verdict_lines
from batchlab.run.strategies import info

COLUMNS = [("strategy", "strategy"), ("throughput_tok_s", "tok/s"), ("requests_per_s", "req/s"),
           ("ttft_p50", "TTFT p50 (s)"), ("ttft_p99", "TTFT p99 (s)"), ("tpot_p50", "TPOT p50 (s)"),
           ("tpot_p99", "TPOT p99 (s)"), ("e2e_p50", "E2E p50 (s)"), ("e2e_p99", "E2E p99 (s)"),
           ("queue_wait_p50", "queue p50 (s)"), ("goodput", "goodput (req/s)"),
           ("slo_attainment", "SLO met"), ("failed", "failed")]
COST_COLUMNS = [("tok_s_per_gpu", "tok/s per GPU"), ("usd_per_m_tokens", "$ per M tokens")]   # a priced backend
METRIC_NAMES = {"ttft_p50": "p50 TTFT (s)", "ttft_p99": "p99 TTFT (s)", "e2e_p50": "p50 E2E (s)",
                "e2e_p99": "p99 E2E (s)", "throughput_tok_s": "throughput (tok/s)", "goodput": "goodput (req/s)"}


@contextmanager
def _quiet() -> Iterator[None]:
    """NOTE: stats.py and verdict.py reduce NaN-only columns (a point where every request failed),
    and numpy warns about each; the report shows those as "—", so the warnings are noise here."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _fittable(requests: pd.DataFrame | None) -> pd.DataFrame | None:
    """NOTE: past_capacity fits a line through the (arrival, queue wait) of finished rows, and a
    missing one (an inf read as missing) makes LAPACK fail and print to the console."""
    if requests is None:
        return None
    return requests[(requests["status"] != "finished") | requests[["arrival_time", "queue_wait"]].notna().all(axis=1)]


def build_report(results_dir: Path) -> tuple[Path, list[str]]:
    """Write report.md, report.html (the same, plots embedded) and the PNGs into results_dir;
    return report.md's path and the verdict."""
    results_dir = Path(results_dir)
    summary, setup, config = load_results(results_dir)
    with fmt.rate_unit(fmt.unit_of(config.get("traffic"))):
        return _build(results_dir, summary, setup, config)


def _build(results_dir: Path, summary: pd.DataFrame, setup: dict, config: dict) -> tuple[Path, list[str]]:
    requests = load_requests(results_dir)
    slo = {k: v for k, v in (config.get("slo") or {}).items() if v}
    seed = int(summary["seed"].dropna().iloc[0]) if summary["seed"].notna().any() else 0
    with _quiet():
        caps = capacity.capacities(summary, requests, slo)
        comparisons = {p: stats.compare(summary, requests, *p, seed=seed) for p in ranked_pairs(caps)}
        crossings = {p: stats.crossovers(summary, *p) for p in comparisons}
    rate = capacity.telling_rate(caps, capacity.ranked(caps)[0], list(summary["rate"].unique()))
    # NOTE: per-class figures are built once and read by the plot, the verdict and the section
    by_class = classes.class_table(requests, config) if classes.has_classes(requests) else None
    figures, burst = _figures(results_dir, summary, requests, config, slo, rate, caps, by_class)
    traffic = config.get("traffic") or {}
    with _quiet():
        lines = verdict_lines(summary, setup, comparisons, slo, stats.past_capacity(summary, _fittable(requests)), caps,
                              burst, traffic.get("rate_step"), _measured_s(traffic))
        lines += classes.class_verdict(by_class, list(dict.fromkeys(summary["strategy"])), rate)
    outcomes = point_outcomes(summary, requests)
    # NOTE: what a reader came for first (the answer, what each strategy sustains, the plots), the
    # details after, and the setup (machine, versions, every knob) last: report.html folds it away
    md = _title(config, lines) + _knees_crossovers(summary, crossings, caps, slo)
    md += hypotheses.hypothesis_lines(summary, caps, lines) + _plots(figures, rate, outcomes)
    md += _tables(summary, outcomes) + _comparisons(comparisons) + hypotheses.theory_lines(summary, requests, config)
    md += _burst(burst, config)
    md += _breakdown(summary, requests, outcomes) + prefix_cache_lines(summary) + turn_lines(requests)
    md += classes.class_lines(requests, config, by_class)
    md += _useful(requests) + _method() + _setup(setup, config)
    path = results_dir / "report.md"
    write_atomic(path, "\n".join(md) + "\n")     # a kill or a full disk mid-write leaves the last report whole
    html.write_html(path)
    return path, lines


def _measured_s(traffic: dict) -> float | None:
    """Seconds of measured traffic per point (None for a replayed trace: its own length)."""
    duration = traffic.get("duration_s")
    return None if traffic.get("arrival") == "trace" or duration is None else float(duration)


def _burst_window(config: dict) -> tuple[float, float] | None:
    step = (config.get("traffic") or {}).get("rate_step")
    if not step:
        return None
    end = step.get("until_s") or _horizon(config)
    return float(step["at_s"]), float(end)


def _horizon(config: dict) -> float:
    t = config.get("traffic") or {}
    return float(t.get("warmup_s", 0)) + float(t.get("duration_s", 0))


def _figures(out: Path, summary, requests, config, slo, rate, caps: dict[str, Capacity],
             by_class=None) -> tuple[dict[str, Path], list]:
    """Every plot, and the burst rows when the traffic has a burst (a rate step or gamma arrivals)."""
    knees = {s: c.rate for s, c in caps.items()} if slo else {}
    broke = {s: (c.broke_at, fmt.listing(list(c.limit))) for s, c in caps.items() if slo and c.broke_at is not None and c.limit}
    figs = {"tradeoff": plots.plot_tradeoff(summary, out, slo, knees, broke),
            "latency_vs_rate": plots.plot_latency_vs_rate(summary, out, slo),
            "pareto": pareto.plot_pareto(summary, out)}
    if cost.priced(summary):
        figs["cost"] = cost.plot_cost(summary, out, slo)
    if requests is None:
        return figs, []
    traffic = config.get("traffic") or {}
    warmup, window = float(traffic.get("warmup_s", 0)), _burst_window(config)
    figs |= _run_figures(out, summary, requests, config, slo, rate, warmup, window)
    fig = classes.class_figure(by_class, out, rate)
    if fig is not None:
        figs["classes"] = fig
    if not window and traffic.get("arrival") != "gamma":
        return figs, []
    burst_rows = _burst_rows(requests, config, warmup, window, slo)
    if window:
        base = {b.strategy: b.baseline_p99_ttft for b in burst_rows if b.rate == rate}
        figs["burst"] = run_plots.plot_burst(requests, out, rate, warmup, window, base, tl.window_for(rate),
                                             (traffic.get("rate_step") or {}).get("to_rate"))
    return figs, burst_rows


def burst_results(results_dir: Path) -> list[tl.BurstResult]:
    """The burst rows of a rate-step run (empty otherwise), from the files, for the terminal."""
    summary, _, config = load_results(Path(results_dir))
    requests, window = load_requests(Path(results_dir)), _burst_window(config)
    if requests is None or not window:
        return []
    slo = {k: v for k, v in (config.get("slo") or {}).items() if v}
    with _quiet():
        return _burst_rows(requests, config, float((config.get("traffic") or {}).get("warmup_s", 0)), window, slo)


def _run_figures(out, summary, requests, config, slo, rate, warmup, window) -> dict[str, Path]:
    caps = {s: config_value(config, info(s).cap) for s in summary["strategy"].unique() if info(s).level == "request"}
    measured = requests[requests["arrival_time"] >= warmup]["rate"]   # NOTE: the lowest rate with anything to show
    figs = {"cdf": plots.plot_cdf(requests, out, rate, slo),
            "timeline": run_plots.plot_timeline(requests, out, rate, warmup, window),
            "requests": run_plots.plot_requests(requests, out, float((measured if len(measured) else summary["rate"]).min()),
                                                warmup)}
    if _has_breakdown(requests):
        figs["breakdown"] = run_plots.plot_breakdown(requests, out)
    figs["useful_work"] = run_plots.plot_useful_work(requests, out, rate, {k: v for k, v in caps.items() if v})
    return {k: v for k, v in figs.items() if v}


def _burst_rows(requests, config, warmup, window, slo) -> list[tl.BurstResult]:
    step = (config.get("traffic") or {}).get("rate_step") or {}
    at = window[0] if window else _horizon(config)      # no step: the whole measured run is the baseline
    out = []
    for (s, rate), rows in requests[requests["repeat"] == 0].groupby(["strategy", "rate"], sort=False):
        out.append(tl.burst(rows, warmup, at, step.get("until_s") if window else None,
                            float(rows["arrival_time"].max()), slo or None, step.get("to_rate")))
    return out


def _title(config: dict, lines: list[str]) -> list[str]:
    md = [f"# batchlab report: {config.get('name', 'run')}", ""]
    md += [f"- **{line}**" if i == 0 else f"- {line}" for i, line in enumerate(lines)]
    return md + [""]


def _setup(setup: dict, config: dict) -> list[str]:
    t = config.get("traffic") or {}
    md = ["## Setup", "", "| | |", "|---|---|"]
    for k, v in setup.items():
        text = ", ".join(f"{n} {x}" for n, x in v.items()) if isinstance(v, dict) else v
        md.append(f"| {k} | {text} |")
    md.append(f"| seed | {t.get('seed')} ({fmt.count(int(t.get('repeats', 1)), 'repeat')}; repeat r uses seed sequence [seed, r]) |")
    md += ["", "Every knob of the run (config.yaml):", "", "```yaml",
           yaml.safe_dump(config, sort_keys=False).strip(), "```", ""]
    return md


def _plots(figures: dict[str, Path], rate: float, outcomes: dict[tuple[str, float], str]) -> list[str]:
    md = ["## Plots", ""]
    if outcomes:
        md += ["Points where no request finished are left out of the curves (why: under each table below): "
               + "; ".join(f"{s} at {fmt.rate(r)}" for s, r in outcomes) + ".", ""]
    for name, path in figures.items():
        md += [CAPTIONS[name].format(rate=fmt.rate(rate)), "", f"![{name}]({path.name})", ""]
    return md


def _tables(summary: pd.DataFrame, outcomes: dict[tuple[str, float], str]) -> list[str]:
    med = stats.medians(summary)
    reps = int(summary["repeat"].nunique())
    every = list(dict.fromkeys(summary["strategy"]))
    md = ["## Results per rate", "",
          f"{fmt.repeats(reps).capitalize()} after warm-up. Throughput in output tokens/s; SLO met is the share of "
          "requests meeting every SLO threshold.", ""]
    columns = COLUMNS + (COST_COLUMNS if cost.priced(summary) else [])
    for rate, rows in med.groupby("rate"):
        md += [f"### {fmt.rate(rate)}", "", _row([label for _, label in columns]), "|" + "---|" * len(columns)]
        md += [_row([_cell(row.get(k), share=k == "slo_attainment") for k, _ in columns]) for _, row in rows.iterrows()]
        md += [""]
        notes = [f"- {s}: {outcomes[(s, float(rate))]}" for s in rows["strategy"] if (s, float(rate)) in outcomes]
        notes += [f"- {s}: not run at this rate (no row in summary.csv)" for s in every if s not in set(rows["strategy"])]
        md += notes + ([""] if notes else [])
    return md


def _comparisons(comparisons: dict) -> list[str]:
    md = ["## Paired comparisons", "",
          "Every strategy ran on the same trace at each (rate, repeat), so each difference is paired. "
          "'a − b' is the first strategy (the one that sustains more traffic) minus the second; a change counts "
          "only when its 95% interval excludes zero (✓).", ""]
    for (a, b), cmp in comparisons.items():
        if cmp.empty:
            continue
        md += [f"### {a} vs {b}", "", _row(["rate", "metric", a, b, "a − b", "change", "95% CI of change", "✓", "interval from"]),
               "|" + "---|" * 9]
        for _, r in cmp.iterrows():
            ci = f"{fmt.change(r['rel_low'])} to {fmt.change(r['rel_high'])}" if pd.notna(r["rel_low"]) else "—"
            md.append(_row([fmt.num(r["rate"]), METRIC_NAMES.get(r["metric"], r["metric"]), _cell(r["a_value"]),
                            _cell(r["b_value"]), _cell(r["estimate"]), fmt.change(r["rel"]),
                            ci, "✓" if r["supported"] else "", r["method"]]))
        md.append("")
    return md


def _knees_crossovers(summary: pd.DataFrame, crossings: dict[tuple[str, str], list], caps: dict[str, Capacity],
                      slo: dict) -> list[str]:
    md = ["## Capacity, knees and crossovers", "", _rule(slo), ""]
    for s in capacity.ranked(caps):
        c = caps[s]
        held = "none of the tested rates" if c.rate is None else fmt.rate(c.rate) + (" (the highest tried)" if c.highest_tried else "")
        broke = (f"; at {fmt.rate(c.broke_at)}: {fmt.listing(list(c.limit)) if c.limit else 'see the table'} missed"
                 if c.broke_at is not None else "")
        md.append(f"- {s}: {held}{broke}")
    rates = sorted(summary["rate"].unique())
    md += ["", f"Crossovers between {fmt.rate(rates[0])} and {fmt.rate(rates[-1])} (medians over repeats):", ""]
    for (a, b), found in crossings.items():
        text = "; ".join(f"{c.leader_after} overtakes {c.leader_before} on {c.metric} at about {fmt.rate(c.rate)}"
                         for c in found)
        md.append(f"- {a} vs {b}: {text or 'none (the same one leads, or they tie within 2%, at every tested rate)'}")
    return md + [""]


def _rule(slo: dict) -> str:
    """The sustain rule in words (report/capacity.py)."""
    served = f"requests completed per second reach {fmt.share(capacity.SERVED)} of those offered"
    if not slo:
        return f"No SLO in the config: a rate counts as sustained when {served}."
    return (f"A tested rate counts as sustained when ≥ {fmt.share(stats.ATTAINMENT)} of its requests meet "
            f"{slo_text(slo)} (a failed request meets nothing) and {served} (a queue that keeps growing fails this "
            f"even when a short run's latencies look fine). Capacity (the knee): the highest sustained rate; "
            f"'missed' names what broke at the next rate up.")


def _burst(rows: list, config: dict) -> list[str]:
    if not rows:
        return []
    step = (config.get("traffic") or {}).get("rate_step")
    what = (f"rate {fmt.num(rows[0].rate)} → {step['to_rate']:g} req/s at {step['at_s']:g} s"
            + (f", back at {step['until_s']:g} s" if step.get("until_s") else "")) if step else "gamma arrivals"
    whole = "" if step else " Without a rate step the whole measured run is the baseline ('before')."
    md = ["## Burst", "", f"Traffic: {what}.{whole} Recovery: seconds after the burst until the p99 TTFT of the requests "
          f"arriving in each window stays within {tl.RECOVERY_SLACK:g} × the pre-burst p99 for {tl.SUSTAIN} windows "
          "in a row. SLO violation: windows whose SLO attainment is below "
          f"{100 * stats.ATTAINMENT:.0f}%, in seconds.", "",
          _row(["strategy", "rate", "window (s)", "pre-burst p99 TTFT (s)", "peak queue before", "peak queue during/after",
                "recovery (s)", "seconds violating SLO"]), "|" + "---|" * 8]
    for b in rows:
        judged = step and np.isfinite(b.baseline_p99_ttft)     # no request finished before: nothing to recover to
        rec = "—" if not judged else (fmt.num(b.recovery_s) if b.recovery_s is not None else "not within the run")
        md.append(_row([b.strategy, fmt.num(b.rate), f"{b.window_s:g}", _cell(b.baseline_p99_ttft), str(b.peak_queue_before),
                        str(b.peak_queue) if step else "—", rec, "—" if b.violating_s is None else fmt.num(b.violating_s)]))
    return md + [""]


def _has_breakdown(requests: pd.DataFrame) -> bool:
    """Backends that batch for themselves (servers) cannot say where a request's time went."""
    return bool(requests[[p for p, _, _ in run_plots.PHASES]].notna().any().any())


def _breakdown(summary: pd.DataFrame, requests: pd.DataFrame | None, outcomes: dict) -> list[str]:
    if requests is None or not _has_breakdown(requests):
        return []
    ok = requests[finished_rows(requests) & (requests["warmup"] == 0)]
    cols = [p for p, _, _ in run_plots.PHASES]
    mean = ok.groupby(["rate", "strategy"], sort=False)[cols + ["e2e"]].mean()
    md = ["## Latency breakdown", "", "Mean seconds per request; the phases add up to E2E. Stalls: step time spent on "
          "other requests' prompt tokens, and gaps after a preemption.", "",
          _row(["rate", "strategy"] + [label for _, label, _ in run_plots.PHASES] + ["E2E"]), "|" + "---|" * (len(cols) + 3)]
    for rate, s in dict.fromkeys(zip(summary["rate"], summary["strategy"])):   # every point, in the order run
        if (rate, s) in mean.index:
            md.append(_row([fmt.num(rate), s] + [_cell(mean.loc[(rate, s), c]) for c in cols + ["e2e"]]))
        elif (s, float(rate)) in outcomes:
            md.append(_row([fmt.num(rate), s, "no requests finished"] + ["—"] * len(cols)))
    return md + [""]


def prefix_cache_lines(summary: pd.DataFrame) -> list[str]:
    """One line per point that ran with prefix caching: the share of prompt tokens (and of full
    blocks) served from the cache, and the prefill it saved. Nothing for runs without a cache."""
    if "prefix_hit_rate_tokens" not in summary or summary["prefix_hit_rate_tokens"].isna().all():
        return []
    md = ["## Prefix cache", "", "Prompt tokens reused from the prefix cache instead of computed (continuous "
          "batching with `continuous.prefix_caching`), per point after warm-up.", ""]
    for _, p in summary[summary["prefix_hit_rate_tokens"].notna()].iterrows():
        cached, computed = int(p["cached_prompt_tokens"]), int(p["computed_prompt_tokens"])
        md.append(f"- {fmt.rate(p['rate'])}, {p['strategy']}, repeat {int(p['repeat'])}: "
                  f"{100 * p['prefix_hit_rate_tokens']:.1f}% of prompt tokens from the cache "
                  f"({100 * p['prefix_hit_rate_blocks']:.1f}% of full blocks); prefill computed "
                  f"{computed:,} tokens, skipped {cached:,}")
    return md + [""]


def _useful(requests: pd.DataFrame | None) -> list[str]:
    b = tl.batches(requests) if requests is not None else pd.DataFrame()
    if b.empty:
        return []
    w = tl.useful_work(b)
    order = {s: i for i, s in enumerate(dict.fromkeys(requests["strategy"]))}
    w = w.sort_values(["strategy", "rate"], key=lambda c: c.map(order) if c.name == "strategy" else c)
    md = ["## Useful work in lockstep batches", "", "Useful decode work Σo / (B × max o) over all batches (slot-weighted); "
          "prompt fill Σp / (B × max p): the share of prefill tokens that are not padding.", "",
          _row(["strategy", "rate", "batches", "mean batch", "useful decode work", "prompt fill"]), "|---|---|---|---|---|---|"]
    md += [_row([r["strategy"], fmt.num(r['rate']), str(int(r["batches"])), f"{r['mean_batch']:.1f}",
                 f"{100 * r['useful_decode']:.0f}%", f"{100 * r['prompt_fill']:.0f}%"]) for _, r in w.iterrows()]
    return md + [""]


def _method() -> list[str]:
    return ["## How the intervals are made", "",
            f"- With ≥ {stats.MIN_REPEATS} repeats: a Student t-interval of the mean paired difference over repeats "
            "(each repeat is a different seeded trace); exact when the differences are normal, and measured at 94–95% "
            "coverage with 3 and 5 repeats on synthetic data (tests/report/test_stats.py).",
            "- Failures count: a request that failed or never finished is an infinite latency in every percentile "
            "(a percentile it reaches reads \"failed\"), and a strategy with more failures is never called faster.",
            "- With fewer: latency percentiles use a paired circular block bootstrap over the requests of the trace "
            "(blocks of √n consecutive arrivals, the same blocks for both strategies), which keeps the correlation "
            "between neighbours in a queue. It covers request-to-request variation within this trace, not trace-to-"
            "trace variation; past a strategy's knee its latencies grow with the run's length and no interval makes "
            "them a property of the rate. Throughput and goodput are whole-run numbers: one run gives no interval.",
            f"- Knee: the highest tested rate where ≥ {100 * stats.ATTAINMENT:.0f}% of requests meet every SLO threshold.",
            f"- Crossover: where the sign of a − b changes between two tested rates (ties within "
            f"{100 * stats.TIE:.0f}% ignored), interpolated linearly.", ""]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _cell(v, share: bool = False) -> str:
    if isinstance(v, float) and v == np.inf:
        return "failed"                 # a latency percentile that reaches failed requests
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "—"
    if isinstance(v, (float, int, np.number)) and not isinstance(v, bool):
        return fmt.share(float(v)) if share else fmt.num(float(v))
    return str(v)
