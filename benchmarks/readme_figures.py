"""Regenerate the measured figures in the README and the docs from the result files the benchmarks commit.

Each benchmark run with `--json docs/results/NAME.json` (or `--out` for the engine comparison)
records its figures, every repeat, the machine's load and the command that made them. This script
renders each file into every block between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`, in
README.md and in any page under docs/, so every figure quoted there can be traced to a file and a
command. `--check` changes nothing and exits 1 if a block disagrees with its file, names a file
that does not exist or has no renderer (the test suite runs it).
Usage: python benchmarks/readme_figures.py [--check] [--results docs/results] [FILE.md ...]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from batchlab.calibrate.accuracy import twin_limit
from batchlab.calibrate.handover import described, handed
from batchlab.calibrate.twin_check import measured_change, steps_over


def _spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """'median (min–max over N)'."""
    return (f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))} "
            f"over {len(values)})")


def _load(d: dict) -> str:
    before = d["load_avg_1_5_15"]["before"][0]
    after = d["load_avg_1_5_15"]["after"][0]
    return f"1-minute load {before:.1f} before, {after:.1f} after, {d.get('cpus', '?')} CPUs"


def sim_speed(d: dict) -> str:
    r = d["ratio_per_repeat"]
    toy, ours = statistics.median(d["toy_wall_s"]), statistics.median(d["batchlab_wall_s"])
    lines = [f"`{d['command']}` ({_load(d)}; medians of {len(r)} interleaved repeats, min–max beside them):", "",
             "| what | measured |", "|---|---|",
             f"| continuous batching on the reference toy simulator's workload ({d['requests']:,} requests, toy "
             f"constants), batchlab's scheduler + driver + clock vs the toy itself | **{statistics.median(r):.2f}×** the toy's speed "
             f"(paired per repeat {min(r):.2f}–{max(r):.2f}×; {ours:.3f} s vs {toy:.3f} s, "
             f"{d['requests'] / ours:,.0f} vs {d['requests'] / toy:,.0f} simulated requests per second of wall time; "
             f"same simulated throughput: "
             f"{d['batchlab_throughput_tok_s']:.0f} vs {d['toy_throughput_tok_s']:.0f} tok/s) |"]
    hours = d.get("hour_at_50", {})
    if "default" in hours:
        h = hours["default"]
        lines.append(f"| one hour at 50 req/s, continuous, default settings ({h['requests']:,} requests) | "
                     f"**{h['wall_s']:.1f} s** of wall time (one run) |")
    if "long_outputs" in hours:
        lines.append(f"| the same hour with 32–256-token outputs (past capacity: a prefill in almost every step) | "
                     f"**{hours['long_outputs']['wall_s']:.1f} s** (one run) |")
    return "\n".join(lines)


def hf_dynamic_vs_naive(d: dict) -> str:
    ttft, thr = d["ttft_ratio_per_repeat"], d["throughput_ratio_per_repeat"]
    served = [s["naive"] for s in d["served_share_at_high_rate_per_repeat"]]
    dyn = [s["dynamic"] for s in d["served_share_at_high_rate_per_repeat"]]
    s = d["setup"]
    return (f"`{d['command']}` ({s['model']} model on {s['device']}, {s['dtype']}, {s['torch_threads']} torch "
            f"thread(s); {_load(d)}): at {d['low_rate']:g} req/s dynamic batching's p50 TTFT was "
            f"**{statistics.median(ttft):.0f}×** lower than naive's (median; per repeat "
            f"{' / '.join(f'{x:.0f}' for x in ttft)}: naive waits for a full batch). At {d['high_rate']:g} req/s, past "
            f"both strategies' capacity (naive served {100 * statistics.median(served):.0f} % of the offered requests, "
            f"dynamic {100 * statistics.median(dyn):.0f} %), dynamic's throughput was **{statistics.median(thr):.2f}×** "
            f"naive's (per repeat {' / '.join(f'{x:.2f}' for x in thr)}).")


def engine_vs_hf_cb(d: dict) -> str:
    names = {"ours": "batchlab continuous (eager)", "ours-compiled": "batchlab continuous (`backend.compile`)",
             "ours-modules": "batchlab continuous (eager, `backend.fused: false`)"}
    busy = d.get("busy")
    beside = f"beside a job burning {100 * busy['duty']:.0f} % of every core; " if busy else ""
    lines = [f"`{d['command']}` (tiny model, CPU, fp32, {d['threads']} torch thread(s); {beside}{_load(d)}; medians over "
             "repeats, the paired ratio's min–max beside it):", "",
             "| concurrency | engine | tok/s | transformers CB | plain `generate()` | ours / transformers CB "
             "| ours / `generate()` | decode step ours / `generate()` | backend_eff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for lv in d["levels"]:
        t = lv["tok_s"]
        for name, e in lv["engines"].items():
            cb, gen, eff = e["over_hf_cb_per_repeat"], e["over_generate_per_repeat"], e["efficiency_per_repeat"]
            lines.append(f"| {lv['concurrency']} | {names.get(name, name)} | {t[name]:,.0f} | {t['hf-cb']:,.0f} | "
                         f"{t['generate']:,.0f} | {e['over_hf_cb']:.2f}× ({min(cb):.2f}–{max(cb):.2f}) | "
                         f"{e['over_generate']:.2f}× ({min(gen):.2f}–{max(gen):.2f}) | {e['step_ratio']:.2f}× | "
                         f"{e['efficiency']:.2f} ({min(eff):.2f}–{max(eff):.2f}) |")
    lines += ["", "Where each engine's time went (step log, share of the run's span; medians over repeats) and its "
              "median overhead per pass:", "",
              "| concurrency | engine | decode passes | prefill passes | ours in a step | ours between steps "
              "| per pass: in / between |", "|---|---|---|---|---|---|---|"]
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    for lv in d["levels"]:
        for name, e in lv["engines"].items():
            b = e["breakdown"]
            lines.append(f"| {lv['concurrency']} | {names.get(name, name)} | {pct(b['decode_frac'])} | "
                         f"{pct(b['prefill_frac'])} | {pct(b['overhead_frac'])} | {pct(b['gap_frac'])} | "
                         f"{b['overhead_ms']:.2f} / {b['gap_ms']:.2f} ms |")
    start = d.get("start_up", {}).get("ours-compiled", {})
    lines += _paired_line(d, "compiled_over_eager", "Compiled over eager throughput", (
        f"; start-up with compile {start['start_s']:.0f} s, {start['graphs']} graph(s) built, "
        f"{start['graphs_after'] - start['graphs']} more during the measured runs." if start else "."))
    lines += _paired_line(d, "fused_over_modules", "Fused pass over transformers' modules (both eager) throughput", ".")
    return "\n".join(lines + _roofline_lines(d, names))


def _roofline_lines(d: dict, names: dict) -> list[str]:
    """The decode step against this CPU's roofline, if the file measured the machine."""
    roof = d.get("machine")
    if not roof:
        return []
    out = ["", f"This CPU measured {roof['matmul_flop_s'] / 1e9:.0f} GFLOP/s on a 1024³ float32 product and "
               f"{roof['copy_bytes_s'] / 1e9:.0f} GB/s copying 256 MiB (read + write; medians of {roof['repeats']}"
               f"{', before the job started' if d.get('busy') else ''}). "
               "A decode step's bound at those rates (every linear weight and the rows' K/V read once, or its "
               "products computed, whichever is longer; 96 tokens of context a row) against the measured step:"]
    for lv in d["levels"]:
        r = lv["roofline"]
        steps = ", ".join(f"{names.get(n, n)} {e['step_ms']['ours']:.1f} ms ({e['step_over_bound']:.1f}× the bound)"
                          for n, e in lv["engines"].items())
        out.append(f"- {lv['concurrency']} rows: bound {r['bound_ms']:.2f} ms (reading {r['read_ms']:.2f}, computing "
                   f"{r['compute_ms']:.2f}); {steps}.")
    return out


def _paired_line(d: dict, key: str, what: str, tail: str) -> list[str]:
    """A paragraph of one paired ratio per level (median, min-max over repeats), if the file has it."""
    levels = [lv for lv in d["levels"] if key in lv]
    if not levels:
        return []
    return ["", f"{what}: " + "; ".join(f"{lv['concurrency']}: {lv[key]:.2f}× ({min(lv[key + '_per_repeat']):.2f}–"
                                         f"{max(lv[key + '_per_repeat']):.2f})" for lv in levels) + tail]


METRIC_NAMES = {"e2e_p50": "p50 E2E", "ttft_p50": "p50 TTFT", "tpot_p50": "p50 TPOT", "ttft_p99": "p99 TTFT",
                "throughput_tok_s": "saturated throughput"}


def _validate_load(d: dict) -> str:
    """The load the real runs saw (recorded at their reference bursts), else this invocation's."""
    seen = d.get("load_1min_at_reference_bursts")
    if seen:
        lo, hi = min(v[0] for v in seen.values()), max(v[1] for v in seen.values())
        return f"1-minute load {lo:.1f}–{hi:.1f} during the real runs, {d.get('cpus', '?')} CPUs"
    if "--skip-profile" in d["command"]:
        return ("profiles and real runs from an earlier invocation without --skip-profile, their load not "
                f"recorded; {d.get('cpus', '?')} CPUs")
    return _load(d)


def _sides(signs: dict | None, metric: str) -> str:
    """A table cell: the share of cells where the simulator read below the real run, and above."""
    if signs is None:
        return ""
    s = signs.get(metric)
    return f" {s['below']:.0%} / {s['above']:.0%} |" if s else " – |"


def _below(per: dict) -> str:
    """' (sim below real in N %)' where the record has it."""
    return f" ({per['below']:.0%} below)" if "below" in per else ""

def validate_sim(d: dict) -> str:
    """Held-out accuracy of the calibrated simulator: per metric, |error| beside the machine's own
    rerun difference, interval coverage and the target; then what each later term of the model earns."""
    pct = lambda x: "–" if x is None or x != x else f"{100 * x:.1f} %"  # noqa: E731
    names = ", ".join(f"`{w}`" for w in d["workloads"])
    lines = [f"`{d['command']}` ({d['cells']} held-out cells: workloads {names} at {d['rates']} req/s, "
             f"{d['duration_s']:g} s of traffic per point, each trace run twice on the real model; "
             f"{d['threads']} torch thread(s); {_validate_load(d)}):", "",
             "| metric | cells | simulator error (abs.), median / P90 | real rerun vs run (abs.), median / P90 "
             "| in 90 % interval | target | met |" + (" simulator below / above the real run |" if d.get("signs") else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if d.get("signs") else "")]
    for m in d["metrics"]:
        lines.append(f"| {METRIC_NAMES.get(m['metric'], m['metric'])} | {m['cells']} | {pct(m['error_median'])} / "
                     f"{pct(m['error_p90'])} | {pct(m['noise_median'])} / {pct(m['noise_p90'])} | {pct(m['coverage'])} | "
                     f"{m['target'] or '–'} | {m['met'] or '–'} |" + _sides(d.get("signs"), m["metric"]))
    lines += ["", f"The 90 % intervals held the real value in **{pct(d['coverage'])}** of all {d['cells']} cells "
              "(an honest 90 % interval: 85–95 %)."]
    if d.get("ablation"):
        full = {m["metric"]: m for m in d["metrics"]}
        keys = [k for k in METRIC_NAMES if k in full]
        lines += ["", "What each term of the step model and each correction earns (same real runs; profiles refitted "
                  "with the term held at zero, or the correction switched off; median absolute error"
                  + (", and the share of cells where the simulator read below the "
                  "real run" if d.get("signs") else "") + "):", "",
                  "| model | " + " | ".join(METRIC_NAMES[k] for k in keys) + " |", "|---" * (len(keys) + 1) + "|",
                  "| the whole model | " + " | ".join(pct(full[k]["error_median"]) + _below(d.get("signs", {}).get(k, {}))
                                                     for k in keys) + " |"]
        for name, per in d["ablation"].items():
            lines.append(f"| {name} | " + " | ".join(pct(per[k]["error_median"]) + _below(per[k]) for k in keys) + " |")
        if d.get("uncorrected"):
            u = d["uncorrected"]
            none = (", no correction" if (d.get("live") or {}).get("first_token")
                    else f", no drift{' or live' if d.get('live') else ''} correction")
            lines.append(f"| the whole model{none} | "
                         + " | ".join(pct(u[k]["error_median"]) if k in u else "–" for k in keys) + " |")
    if d.get("drift"):
        median_se = any("timings" in v for f in d["drift"].values() for v in f.values())
        lines += ["", "Drift: the reference burst (8 requests, 48 + 24 tokens) ran at " + "; ".join(
            f"`{w}` " + ", ".join(f"{v['factor']:.2f}× ({lvl}, spread {100 * v['spread']:.0f} %)" for lvl, v in f.items())
            for w, f in d["drift"].items())
            + " the time the profiles predict for it; each workload's replays are scaled by its factor, and "
            + ("the standard error of the timings' median (their spread × √(π/2) / √n) joins the fit's error in the "
               "intervals." if median_se else "the spread of the three timings joins the fit's error in the intervals.")]
    return "\n".join(lines + _live(d.get("live")))


def _per_workload(per_w: dict) -> str:
    """'`w` 1.23× (level, ± 5 %); ...' over the workloads with a measured factor (a delay: '4.1 ms
    (level, ± 0.6 ms)'); '' where none has one."""
    per = {w: {lvl: v for lvl, v in levels.items() if v["cells"]} for w, levels in per_w.items()}
    return "; ".join(f"`{w}` " + ", ".join(f"{_correction(v, lvl)}" for lvl, v in f.items()) for w, f in per.items() if f)


def _correction(v: dict, lvl: str, se: bool = True) -> str:
    """A factor or delay with its level, its standard error, and whether validation.gate left it out."""
    out = "" if v.get("applied", True) else ", not applied"
    if "seconds" in v:
        return f"{1e3 * v['seconds']:.1f} ms ({lvl}" + (f", ± {1e3 * v['se']:.1f} ms" if se else "") + out + ")"
    return f"{v['factor']:.2f}× ({lvl}" + (f", ± {100 * v['se']:.0f} %" if se else "") + out + ")"


def _live(rec: dict | None) -> list[str]:
    """The live and first-token factors each workload was replayed with (measured on the others),
    and the pooled ones."""
    rec = rec or {}
    lines, measured = [], _per_workload(rec.get("per_workload", {}))
    if measured:
        pooled = rec.get("pooled", {})
        lines += ["", "Live factor (real over replayed p50 TPOT on the *other* workloads' cells, both real runs; "
                  "each workload's replays scaled by its own, so no cell is judged on itself): " + measured
                  + ("; over every workload " + ", ".join(f"{v['factor']:.2f}× ({lvl})" + _on_drift(v) for lvl, v in pooled.items())
                     + ", the factor written into the live profiles." if pooled else ".")]
    first = _per_workload(rec.get("first_token", {}).get("per_workload", {}))
    if first:
        pooled = {lvl: v["first_token"] for lvl, v in rec.get("pooled", {}).items() if v.get("first_token", {}).get("cells")}
        what = ("First-token delay (seconds each request waits before the scheduler: what p50 TTFT still missed on the "
                if rec["first_token"].get("form") == "delay" else
                "First-token factor (on the prompt-pass and front-end terms: what p50 TTFT still missed on the ")
        lines += ["", what + "*other* workloads after the live factor): " + first
                  + ("; over every workload " + ", ".join(_correction(v, lvl, se=False) for lvl, v in pooled.items())
                     + "." if pooled else ".")]
    return lines


CORRECTION_METRICS = ("e2e_p50", "ttft_p50", "tpot_p50")


def corrections(d: dict) -> str:
    """Every combination of validate's three corrections on the same kept real runs: per kept
    validation the median |error| of p50 E2E / TTFT / TPOT and its most one-sided metric; per
    combination, how many validations have no metric one-sided and the mean of the errors."""
    conds, held = d["conditions"], set(d.get("held_out", []))
    names = [n for n in conds if n not in held] + [n for n in conds if n in held]
    # the summaries beside the one over the directories not held out: column title -> label -> summary
    extra = {t: {s["label"]: s for s in d[part]} for part, t in (("summary_held_out", "held out"), ("summary_all", "all"))
             if d.get(part)}
    cut = 100 * d["one_sided_above"]
    lines = [f"`{d['command']}`: the real runs of each kept validation replayed under every combination, no "
             f"real run repeated; per validation, median |error| of p50 E2E / TTFT / TPOT and its most one-sided "
             f"metric (in bold where one sign holds in more than {cut:.0f} % of cells):", "",
             "| corrections | " + " | ".join(f"`{n}`" + (" (held out)" if n in held else "") for n in names)
             + " | no metric one-sided | mean error |" + "".join(f" {t}: no metric one-sided | {t}: mean error |" for t in extra),
             "|---|" + "---|" * (len(names) + 2 + 2 * len(extra))]
    floor = [" / ".join(f"{100 * conds[n]['floor'][m]:.1f}" for m in CORRECTION_METRICS) + " %" for n in names]
    lines.append("| rerun floor (real vs real) | " + " | ".join(floor) + " | – | – |" + " – | – |" * len(extra))
    for s in d["summary"]:
        cells = [_correction_cell(next(v for v in conds[n]["variants"] if v["label"] == s["label"]), cut) for n in names]
        lines.append(f"| {s['label']} | " + " | ".join(cells) + " |" + "".join(
            f" {h['balanced']} of {h['of']} | {100 * h['mean_error']:.1f} % |" for h in
            [s, *(rows.get(s["label"]) for rows in extra.values())] if h))
    lines += ["", "Validations: " + "; ".join(f"`{n}` {conds[n]['dir']} ({conds[n]['cells']} cells per metric)" for n in names) + "."]
    return "\n".join(lines + _correction_coverage(d, names) + _worst_workload(conds, names) + _live_profiles(conds, names))


def _live_profiles(conds: dict, names: list[str]) -> list[str]:
    """Per validation, what the live profile each default combination wrote multiplies the decode
    step by, with the drift probe applied and without (records that kept it; none: nothing)."""
    pair = (FULL["delay"], FULL["delay"].removeprefix("drift probe + "))
    rows = []
    for n in names:
        got = [next((v.get("live_profile") for v in conds[n]["variants"] if v["label"].split(" (")[0] == p), None)
               for p in pair]
        if all(got):
            rows.append(f"`{n}` " + " / ".join(", ".join(f"{x:.2f}×" for x in g.values()) for g in got))
    return ["", f"The decode step in the live profile each validation wrote (over the profile's), {pair[0]} / "
            f"{pair[1]}: " + "; ".join(rows) + "."] if rows else []


FULL = {"factor": "drift probe + live factor + first-token factor", "delay": "drift probe + live factor + first-token delay"}


def _worst_workload(conds: dict, names: list[str]) -> list[str]:
    """Per validation, the workload furthest from the real runs with every correction on and the
    first-token factor, its signed errors there and with the delay instead (records that kept
    each workload's errors and compared the two forms; none: nothing)."""
    rows = []
    for n in names:
        by = {v["label"]: v.get("by_workload") for v in conds[n]["variants"]}
        factor, delay = by.get(FULL["factor"]), by.get(FULL["delay"])
        if not factor or not delay:
            continue
        w = max(factor, key=lambda k: max(abs(e) for e in factor[k].values()))
        signed = lambda e: " / ".join(f"{100 * e[m]:+.0f}" for m in CORRECTION_METRICS) + " %"   # noqa: E731
        rows.append(f"| `{n}` | `{w}` | {signed(factor[w])} | {signed(delay[w])} |")
    if not rows:
        return []
    return ["", "The workload furthest from the real runs with every correction on (first-token factor), its signed "
            "median error (p50 E2E / TTFT / TPOT; + : the replay above) there and with the first-token delay instead:", "",
            "| validation | workload | with the factor | with the delay |", "|---|---|---|---|", *rows]


def _correction_coverage(d: dict, names: list[str]) -> list[str]:
    """How often the 90 % intervals held the real value with every correction on, per validation,
    and the same under an earlier rule for building them where one was recorded."""
    conds = d["conditions"]
    if "interval" not in next(iter(conds.values()), {}):
        return []
    def held(cov: dict) -> str:
        return ", ".join(f"`{n}` " + (_pct(cov[n]) if n in cov else "–") for n in names)
    def every_on(on: dict) -> bool:      # every correction on as validate applies them, at whatever gate and count
        return all(x in (True, "delay") for k, x in on.items() if k not in ("gate", "se_units"))
    def tuning(on: dict) -> tuple[float, str]:
        return on.get("gate", 0), on.get("se_units", "")
    lines = []
    for gate, units in sorted({tuning(v["on"]) for c in conds.values() for v in c["variants"] if every_on(v["on"])}):
        now = {n: next(v["coverage"] for v in c["variants"] if every_on(v["on"]) and tuning(v["on"]) == (gate, units))
               for n, c in conds.items()}
        tags = ", ".join([f"gate {gate:g}"] * bool(gate) + [f"standard errors over {units}"] * bool(units))
        lines += ["", f"90 % intervals with the three corrections{f' ({tags})' if tags else ''} (target 85–95 %) "
                  f"held {held(now)}; built as {next(iter(conds.values()))['interval']}."]
    for e in d.get("earlier_intervals", []):
        lines += ["", f"The same cells with the intervals built as {e['interval']} (`{e['command']}`): held {held(e['coverage'])}."]
    return lines


def _correction_cell(v: dict, cut: float) -> str:
    errors = " / ".join(f"{100 * v['metrics'][m]['error_median']:.1f}" for m in CORRECTION_METRICS)
    metric, side, share = max(((m, side, v["metrics"][m][side]) for m in CORRECTION_METRICS for side in ("below", "above")),
                              key=lambda x: x[2])
    said = f"{METRIC_NAMES.get(metric, metric)} {100 * share:.0f} % {side}"
    return f"{errors} % ({'**' + said + '**' if 100 * share > cut else said})"


def same_point(d: dict) -> str:
    """One trace run again and again in one process: its spread, its trend, and where the replay falls."""
    lines = [f"`{d['command']}` ({d['runs']} runs per strategy of one {d['rate']:g} req/s trace, {d['duration_s']:g} s "
             f"measured each, strategies alternating, one process and one model load; {_load(d)}):", "",
             "| strategy | metric | median | min / max over the median | CV | later half / earlier half "
             "| replayed at the profile's speed | real runs above the replay |", "|---|---|---|---|---|---|---|---|"]
    for strategy, per in d["per_strategy"].items():
        for m, v in per.items():
            replay = f"{1e3 * v['replayed']:.1f} ms" if "replayed" in v else "–"
            above = f"{v['real_runs_above_replay']:.0%}" if "replayed" in v else "–"
            lines.append(f"| {strategy} | {METRIC_NAMES.get(m, m)} | {1e3 * v['median']:.1f} ms | "
                         f"{v['min_over_median']:.2f} / {v['max_over_median']:.2f} | {100 * v['cv']:.0f} % | "
                         f"{v['later_over_earlier']:.2f} | {replay} | {above} |")
    lines += ["", f"Python objects alive grew by {d['objects_growth_per_run']:,.0f} per run."]
    return "\n".join(lines)


def _memory(res: dict) -> str:
    m = res.get("memory", {})
    if "batchlab_peak_memory_bytes" in m:
        return f"{m['batchlab_peak_memory_bytes'] / 2**20:.0f} MiB peak RSS above its loaded baseline"
    if "kv_pool" in res and "num_gpu_blocks" in res["kv_pool"]:
        pool = res["kv_pool"]
        used = m.get("vllm:kv_cache_usage_perc")
        return (f"KV pool of {int(pool['num_gpu_blocks'] * pool['block_size']):,} tokens reserved up front; peak use "
                + (f"{100 * used:.1f} %" if used is not None else "not reported"))
    return "not reported"


def serving(d: dict) -> str:
    """batchlab serve, vLLM and transformers serve on one trace: each server's sustained rate by
    bisection per repeat (repeats in alternating order), its saturated throughput from a burst, the
    per-repeat ratios of the best batchlab strategy to vLLM, and every probe with why it failed."""
    t, slo, rule = d["trace"], d["slo"], d["rule"]
    limits = " and ".join(f"p99 {k.removesuffix('_s').upper()} ≤ {v * 1e3:g} ms" for k, v in slo.items())
    pin = "pinned to one core, the load generator on the other" if d["pinned"] else "not pinned"
    orders = "; ".join(" → ".join(_short(n) for n in o) for o in d["order"])
    lo, hi = rule["bracket_start"]
    lines = [f"`{d['command']}` ({t['arrival']} arrivals, {t['duration_s']:g} s of traffic per point after "
             f"{t['warmup_s']:g} s warm-up, {t['prompt_len']}-token prompts and outputs; servers {pin}; {_load(d)}). "
             f"A rate is sustained when no request failed, {limits}, the server served ≥ {100 * rule['served']:.0f} % "
             f"of the output tokens offered in the measured window, and TTFT did not grow with arrival time by more "
             f"than {rule['growth_s_per_s']:g} s/s (the report's past-capacity test). Each search starts from "
             f"{lo:g}–{hi:g} req/s (later repeats from the previous repeat's bracket) and bisects until hi / lo − 1 "
             f"≤ {100 * rule['tolerance']:g} %; {d['sustain_repeats']} repeats per server, each server restarted, "
             f"in the order {orders}. Saturated throughput: {rule['burst']} requests sent at once, output tok/s in "
             f"the burst's steady middle. Medians over repeats, each repeat's value in brackets:", "",
             "| server | sustained req/s | first failing req/s | points per search | p99 TTFT / TPOT there "
             "| saturated tok/s (burst) | tok/s served at the first failing rate | memory (what it is) |",
             "|---|---|---|---|---|---|---|---|"]
    rows, done = _serving_rows(d, rule)
    lines += rows
    lines += _versus(done, rule)
    lines += _overloaded(done)
    lines += _serving_notes(d, done)
    return "\n".join(lines)


def _overloaded(done: dict[str, list[dict]]) -> list[str]:
    """Past the knee: each server at a multiple of its own sustained rate, per repeat: the share
    of the offered output tokens it served in the window (target >= 95 % for batchlab), its p50
    TTFT and p99 TPOT, and how late the client's sends went."""
    out = []
    for name, reps in done.items():
        pts = [r["overload"] for r in reps if r.get("overload")]
        if not pts:
            continue
        each = "; ".join(f"{p['rate']:g} req/s: {100 * p['served_share']:.1f} % served, p50 TTFT "
                         f"{p['ttft_p50']:.2f} s, p99 TPOT {_ms(p['tpot_p99'])}, sends {1e3 * p['send_lag_p99']:.1f} ms "
                         f"late p99{_refused(p)}" for p in pts)
        m = statistics.median(p["served_share"] for p in pts)
        verdict = (f" Target ≥ 95 %: **{'met' if m >= 0.95 else 'not met'}**." if name.startswith("batchlab") else "")
        out.append(f"{name} past the knee, at {pts[0]['factor']:g}× each repeat's sustained rate: "
                   f"**{100 * m:.1f} %** of the offered tokens served (median; {each}).{verdict}{_held(reps)}")
    return out + [""] if out else []


def _refused(p: dict) -> str:
    """How many of a point's requests did not finish (a bounded queue answers 429), if any."""
    if not p.get("failed"):
        return ""
    why = next(iter(p.get("errors") or []), "no error recorded").split(";")[0]
    return f", {p['failed']:,} of {p['num_requests']:,} not served ({why})"


def _ms(seconds: float) -> str:
    """Milliseconds, or a dash where a percentile counts requests that never finished (infinite)."""
    return f"{1e3 * seconds:.0f} ms" if math.isfinite(seconds) else "– (unfinished requests count as infinite)"


def _held(reps: list[dict]) -> str:
    """Tokens per second served in the window past the knee over those served at the knee, per
    repeat: 1 means the server kept its knee's throughput under overload (no collapse)."""
    ratios = []
    for r in reps:
        knee = next((p for p in r.get("points", []) if p["rate"] == r.get("sustained_rate")), None)
        if r.get("overload") and knee and knee.get("window_tok_s"):
            ratios.append(r["overload"]["window_tok_s"] / knee["window_tok_s"])
    if not ratios:
        return ""
    return (f" Served tok/s there over served tok/s at the knee: {statistics.median(ratios):.2f}× "
            f"({', '.join(f'{x:.2f}' for x in ratios)}).")


def _serving_rows(d: dict, rule: dict) -> tuple[list[str], dict[str, list[dict]]]:
    """One table row per server (medians over its repeats), and the repeats that ran, by server."""
    lines: list[str] = []
    done: dict[str, list[dict]] = {}
    for res in d["servers"]:
        reps = [r for r in res["repeats"] if "error" not in r]
        if not reps:
            err = next((r["error"] for r in res["repeats"]), "not run")
            lines.append(f"| {res['server']} | could not run: {err[:80]} | – | – | – | – | – | – |")
            continue
        done[res["server"]] = reps
        ok = [r["sustained_rate"] for r in reps]
        at = [_point(r, r["sustained_rate"]) for r in reps if r["sustained_rate"] is not None]
        fail_pts = [_point(r, r["failed_rate"]) for r in reps if r["failed_rate"] is not None]
        sat = [r["saturated"]["tok_s"] for r in reps if r.get("saturated")]
        there = (f"{1e3 * statistics.median(p['ttft_p99'] for p in at):,.0f} / "
                 f"{1e3 * statistics.median(p['tpot_p99'] for p in at):.1f} ms") if at else "–"
        if not rule["max_points"]:         # --max-points 0: the burst alone, nothing searched
            ok = ["not searched"]
        lines.append(f"| {res['server']} | {_median_of(ok, '{:g}')} | {_median_of([r['failed_rate'] for r in reps], '{:g}')} | "
                     f"{' / '.join(str(len(r['probes'])) for r in reps)} | {there} | {_median_of(sat, '{:,.0f}')} | "
                     f"{_median_of([p['window_tok_s'] for p in fail_pts], '{:,.0f}')} | "
                     f"{_memory(reps[-1])} |")
    return lines, done


def _serving_notes(d: dict, done: dict[str, list[dict]]) -> list[str]:
    """Every probe of every search with why it failed, the serving overhead, the load generator's
    lag, and which lines an earlier run carried."""
    lines: list[str] = []
    for name, reps in done.items():
        for r in (r for r in reps if r["points"]):
            probes = " · ".join(f"{p['rate']:g} " + ("✓" if p["sustained"] else f"✗ ({', '.join(p['why'])})")
                                + _late(p) for p in r["points"])
            lines.append(f"- {name}, repeat {r['repeat'] + 1} ({_nth(r['position'])}; 1-minute load "
                         f"{r['load_1min_before']:.1f}): {probes}" + ("" if r["settled"] else " — not settled"))
    carried = d.get("carried", {})
    for key, o in d.get("overhead", {}).items():
        if isinstance(o, dict):
            srv, cli = o["server_added_ttft_per_repeat_ms"], o["added_ttft_per_repeat_ms"]
            lines.append(f"- Serving overhead, {key} (simulator in real time, {d['overhead']['rate']:g} req/s): p50 TTFT "
                         f"over the same scheduler in-process, counted from the moment httpx writes the request: "
                         f"**{_spread(srv, '{:+.2f}')} ms**; as the client sees it: {_spread(cli, '{:+.2f}')} ms.")
    for label, o in d.get("loadgen", {}).items():
        lines.append(f"- Load generator's send lag p99 at 200 req/s ({label}): **{_spread(o['runs_ms'])} ms**.")
    for part, c in carried.items():
        lines.append(f"- The {part} lines come from an earlier run, `{c['command']}` ({_load(c | {'cpus': d['cpus']})}).")
    return lines


def _versus(done: dict[str, list[dict]], rule: dict) -> list[str]:
    """The best batchlab strategy (highest median sustained rate) against vLLM, repeat by repeat
    (the two ran back to back in each repeat), with the targets: both ratios >= 1.0."""
    ours = {n: statistics.median(r["sustained_rate"] or 0.0 for r in reps) for n, reps in done.items()
            if n.startswith("batchlab")}
    if not ours or "vllm" not in done:
        return []
    name = max(ours, key=ours.get)
    pairs = list(zip(done[name], done["vllm"]))
    out = [""]
    # NOTE: a repeat where batchlab held no rate counts as 0x; one where vLLM held none has no ratio
    rate = [(a["sustained_rate"] or 0.0) / b["sustained_rate"] for a, b in pairs if b["sustained_rate"]]
    if rate:
        m = statistics.median(rate)
        out.append(f"{name} against vLLM, sustained rate: **{m:.2f}×** (median of per-repeat ratios "
                   f"{' / '.join(f'{x:.2f}' for x in rate)}; each rate known to within its bracket, ≤ "
                   f"{100 * rule['tolerance']:g} % wide when settled). Target ≥ 1.0×: **{'met' if m >= 1 else 'not met'}**"
                   + ("" if min(rate) >= 1 or max(rate) <= 1 else "; the repeats disagree on which is higher") + ".")
    sat = [a["saturated"]["tok_s"] / b["saturated"]["tok_s"] for a, b in pairs if a.get("saturated") and b.get("saturated")]
    if sat:
        m = statistics.median(sat)
        out.append(f"{name} against vLLM, saturated throughput: **{m:.2f}×** (median of per-repeat ratios "
                   f"{' / '.join(f'{x:.2f}' for x in sat)}). Target ≥ 1.0×: **{'met' if m >= 1 else 'not met'}**.")
    return out + [""]


LATE_S = 0.1     # a load generator this late (p99) was itself short of CPU: a point to read with care


def _late(p: dict) -> str:
    """Marks a point where the load generator sent late: not part of the rule, but a sign that
    something else took the client's core, so the point may say more about the machine."""
    lag = p.get("send_lag_p99", 0.0)
    return f" [sends {1e3 * lag:.0f} ms late, p99]" if lag > LATE_S else ""


def _point(r: dict, rate: float) -> dict:
    return next(p for p in r["points"] if p["rate"] == rate)


def _median_of(values: list, fmt: str) -> str:
    """'median (each, each, ...)'; None reads 'none'."""
    if values and isinstance(values[0], str):
        return values[0]
    shown = ", ".join("none" if v is None else fmt.format(v) for v in values)
    known = [v for v in values if v is not None]
    return f"{fmt.format(statistics.median(known)) if known else 'none'} ({shown})" if values else "–"


def _short(name: str) -> str:
    return name.removeprefix("batchlab serve ")


def _nth(i: int) -> str:
    return ["1st", "2nd", "3rd"][i] if i < 3 else f"{i + 1}th"


def prefix_cache(d: dict) -> str:
    w = d["workload"]
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    lines = [f"`{d['command']}` ({_load(d)}; {w['system_prompts']} system prompts of {w['system_tokens']:,} tokens, "
             f"{w['user_tokens']}-token user messages, {w['output_tokens']} output tokens, blocks of {w['block_size']}; "
             "medians over repeats (traces of different seeds), min–max beside them):", "",
             "| backend | capacity without caching | rate (80 %) | p50 TTFT without caching | with caching | cut "
             "| hit rate (tokens / blocks) |", "|---|---|---|---|---|---|---|"]
    parts = [("simulator (llama2-7b-a100)", d["simulator"], "bisection on the Poisson rate"),
             ("HF step engine (tiny model, CPU)", d.get("hf"), "saturated burst")]
    verdicts = []
    for name, part, how in parts:
        if not part:
            continue
        runs, cut = part["runs"], part["ttft_cut_per_repeat"]
        hits = [r["on"]["prefix_hit_rate_tokens"] for r in runs]
        blocks = [r["on"]["prefix_hit_rate_blocks"] for r in runs]
        lines.append(f"| {name} | {part['capacity_req_s']:.2f} req/s ({how}) | {part['rate_req_s']:.2f} req/s | "
                     f"{_spread([r['off']['ttft_p50_s'] for r in runs], '{:.3f}')} s | "
                     f"{_spread([r['on']['ttft_p50_s'] for r in runs], '{:.3f}')} s | "
                     f"**{statistics.median(cut):.1f}×** ({min(cut):.1f}–{max(cut):.1f}) | "
                     f"{pct(statistics.median(hits))} / {pct(statistics.median(blocks))} |")
        verdicts.append(f"{name}: **{'met' if statistics.median(cut) >= d['target_ttft_cut'] else 'not met'}**")
    lines += ["", f"Target: p50 TTFT cut ≥ {d['target_ttft_cut']:g}× — " + "; ".join(verdicts) + "."]
    if d.get("hf"):
        runs = d["hf"]["runs"]
        same = sum(r["sim_same_trace_same_hits_per_request"] for r in runs)
        lines.append(f"The simulator replaying each HF trace (same arrivals, same prompts) reused the same prompt "
                     f"tokens for every request in {same} of {len(runs)} repeats (hit rate "
                     f"{', '.join(pct(r['sim_same_trace_hit_rate_tokens']) for r in runs)} vs the engine's "
                     f"{', '.join(pct(r['on']['prefix_hit_rate_tokens']) for r in runs)}).")
    rep = d["replicas"]
    lines += ["", f"{rep['replicas']} simulated replicas at {rep['rate_req_s']:.1f} req/s (80 % of {rep['replicas']} × "
              f"one replica's capacity), caching on; cache-aware router with a slack of {rep['slack']} outstanding "
              "requests:", "", "| KV blocks per replica | router | hit rate (tokens) | p50 TTFT | p90 TTFT |", "|---|---|---|---|---|"]
    for st in rep["settings"]:
        for router, pts in st["routers"].items():
            lines.append(f"| {st['kv_blocks_per_replica']:,} | {router} | "
                         f"{pct(statistics.median(p['prefix_hit_rate_tokens'] for p in pts))} | "
                         f"{_spread([p['ttft_p50_s'] for p in pts], '{:.3f}')} s | "
                         f"{_spread([p['ttft_p90_s'] for p in pts], '{:.3f}')} s |")
    return "\n".join(lines)


def policies(d: dict) -> str:
    t = d["targets"]
    parts = [(k, name, d[k]) for k, name in (("sim", "simulator (llama2-7b-a100)"), ("hf", "HF step engine (tiny, CPU)"))
             if k in d]
    lines = [f"`{d['command']}` ({_load(d)}; medians over repeats, min–max beside them):", "",
             f"**Shortest-job-first vs FCFS**, bimodal outputs (80 % short, 20 % long), max_num_seqs "
             f"{d['max_num_seqs']['sjf']}, at 90 % of FCFS capacity; SJF's aging cap {d['sim']['sjf']['aging_s']:g} s:", "",
             "| backend | capacity (burst) | rate | mean E2E: FCFS | SJF, true lengths | SJF, guess ±50 % | mean E2E cut "
             "| p99 E2E, SJF ÷ FCFS | gain kept with the guess |", "|---|---|---|---|---|---|---|---|---|"]
    for _, name, p in parts:
        s = p["sjf"]
        m = s["mean_e2e_s"]
        lines.append(f"| {name} | {s['capacity_req_s']:.1f} req/s | {s['rate_req_s']:.1f} req/s | {m['fcfs']:.2f} s | "
                     f"{m['sjf_oracle']:.2f} s | {m['sjf_noisy']:.2f} s | "
                     f"**{_spread([100 * x for x in s['mean_e2e_cut_per_repeat']], '{:.0f}%')}** | "
                     f"{_spread(s['p99_ratio_per_repeat'], '{:.2f}×')} | {_spread([100 * x for x in s['noisy_gain_kept_per_repeat']], '{:.0f}%')} |")
    lines += ["", f"**VTC vs FCFS**, two tenants with the same lengths, `heavy` sending 4× what `light` sends (light 40 % "
              f"of capacity, heavy 160 %), max_num_seqs {d['max_num_seqs']['vtc']}; light's p99 TTFT, and its ratio to "
              "light's solo run (the same light requests, heavy removed):", "",
              "| backend | capacity (burst) | light / heavy | solo | FCFS | VTC | VTC ÷ solo | FCFS ÷ solo |",
              "|---|---|---|---|---|---|---|---|"]
    for _, name, p in parts:
        v = p["vtc"]
        med = lambda side: statistics.median(r[side]["light_ttft_p99_s"] for r in v["runs"])   # noqa: E731
        lines.append(f"| {name} | {v['capacity_req_s']:.1f} req/s | {v['light_req_s']:.1f} / {v['heavy_req_s']:.1f} req/s | "
                     f"{med('solo'):.3f} s | {med('fcfs'):.2f} s | {med('vtc'):.3f} s | "
                     f"**{_spread(v['per_repeat']['vtc'], '{:.1f}×')}** | {_spread(v['per_repeat']['fcfs'], '{:.0f}×')} |")
    loads = d["sim"].get("vtc_light_loads")
    if loads:
        lines += ["", "Simulator, heavy at 200 % of capacity, light's own load varied — light's p99 TTFT under VTC ÷ solo: "
                  + "; ".join(f"light at {100 * x['light_share_of_capacity']:.0f} %: "
                              f"{_spread(x['vtc_over_solo_per_repeat'], '{:.1f}×')} (its p50 TPOT, the step time "
                              f"of the batch it shares, "
                              f"{statistics.median(x['light_p50_tpot_vtc_over_solo_per_repeat']):.1f}× solo's)"
                              for x in loads) + "."]
    verdict = lambda ok: "met" if ok else "not met"   # noqa: E731
    lines += ["", "Targets: " + "; ".join(
        f"{name}: SJF mean E2E cut ≥ {100 * t['sjf_mean_e2e_cut']:.0f} % with p99 ≤ {t['sjf_p99_ratio']:g}× **"
        f"{verdict(p['sjf']['mean_e2e_cut'] >= t['sjf_mean_e2e_cut'] and p['sjf']['p99_ratio'] <= t['sjf_p99_ratio'])}**, "
        f"VTC light p99 TTFT ≤ {t['vtc_light_vs_solo']:g}× solo **{verdict(p['vtc']['target_met'])}**" for _, name, p in parts) + "."]
    if "hf" in d:
        lines.append(_policies_agree(d))
    return "\n".join(lines)


def _policies_agree(d: dict) -> str:
    """Whether the simulator and the HF engine rank the policies alike."""
    sides = {k: d[k]["sjf"]["mean_e2e_s"] for k in ("sim", "hf")}
    order = {k: sorted(m, key=m.get) for k, m in sides.items()}
    cut = {k: {s: m[s] < m["fcfs"] for s in ("sjf_oracle", "sjf_noisy")} for k, m in sides.items()}
    helps = {k: d[k]["vtc"]["light_p99_ttft_vs_solo"]["vtc"] < d[k]["vtc"]["light_p99_ttft_vs_solo"]["fcfs"]
             for k in ("sim", "hf")}
    direction = cut["sim"] == cut["hf"] and helps["sim"] == helps["hf"]
    return (f"Simulator and HF engine agree in direction: **{'yes' if direction else 'no'}** (each SJF variant "
                 f"{'below' if cut['sim']['sjf_oracle'] else 'above'} FCFS in mean E2E on the simulator, "
                 f"{'below' if cut['hf']['sjf_oracle'] else 'above'} on HF; VTC cuts light's p99 TTFT against FCFS on "
                 f"{'both' if all(helps.values()) else 'one'}); in full ranking of mean E2E: "
                 f"**{'yes' if order['sim'] == order['hf'] else 'no'}** (simulator {' < '.join(order['sim'])}; "
                 f"HF {' < '.join(order['hf'])}).")


def ray_sweep(d: dict) -> str:
    r, wi = d["ratio_per_repeat"], d["ratio_with_init_per_repeat"]
    local, ray = statistics.median(d["local_s"]), statistics.median(d["ray_s"])
    same = "byte-identical in every repeat" if d["csvs_identical"] else "NOT identical"
    return (f"`{d['command']}` ({d['points']} simulated points: {d['strategies']} strategies × {len(d['rates'])} rates × "
            f"{d['repeats_per_sweep']} repeats, {d['duration_s']:g} s of traffic each; `local` against a local Ray "
            f"{d['ray_version']} with {d['ray_cpus']} CPUs, run back to back {len(r)} times; {_load(d)}): the sweep took "
            f"**{local:.1f} s** locally and **{ray:.1f} s** on Ray, **{statistics.median(r):.2f}×** (median; paired per "
            f"repeat {min(r):.2f}–{max(r):.2f}×). Counting the {d['ray_init_s']:.1f} s that starting Ray takes once per "
            f"command: {statistics.median(wi):.2f}×. requests.csv and summary.csv (less `wall_s`) were {same}."
            + _point_time(d))


def _point_time(d: dict) -> str:
    """How long the points themselves ran on each side: the sign of workers sharing cores."""
    if "point_wall_s_sum" not in d:
        return ""
    p = d["point_wall_s_sum"]
    loads = ", ".join(f"{x:.1f}" for x in d["load_1min_after_each_repeat"])
    return (f" The points themselves ran {statistics.median(p['local']):.1f} s in all locally and "
            f"{statistics.median(p['ray']):.1f} s on Ray (sums of `wall_s`, medians; 1-minute load after each repeat: {loads}).")


def client_vs_vllm_bench(d: dict) -> str:
    """Our load client against `vllm bench serve` on one trace: per mode, the median of the
    per-repeat ratios batchlab / vLLM with their min–max; bold where the median is within 3 %."""
    t, before, after = d["trace"], d["load_avg_1_5_15_before"][0], d["load_avg_1_5_15_after"][0]
    names = {"concurrent": "concurrent (same server conditions)", "sequential": "sequential (one client at a time)"}
    n = len(d["concurrent"]["repeats"])
    lines = [f"`{d['command']}` (one seeded Poisson trace, {t['rate']:g} req/s for {t['duration_s']:g} s: "
             f"{t['requests']} requests, {t['prompt_len']}-token prompts and {t['output_len']}-token outputs; "
             f"{'server pinned to one core, both clients on the other' if d['pinned'] else 'not pinned'}; "
             f"1-minute load {before:.1f} before, {after:.1f} after). Ratios batchlab / vLLM, medians of {n} "
             "repeats, min–max over repeats beside them:", "",
             "| mode | p50 TTFT | p50 TPOT | p50 E2E | p50 ITL |", "|---|---|---|---|---|"]
    for mode in ("concurrent", "sequential"):
        m = d[mode]
        cells = []
        for metric in ("ttft", "tpot", "e2e", "itl"):
            per = [r["ratio"][metric] for r in m["repeats"]]
            med = f"{m['median_ratio'][metric]:.3f}"
            cells.append(f"{f'**{med}**' if m['within_3pct'].get(metric) else med} ({min(per):.3f}–{max(per):.3f})")
        lines.append(f"| {names[mode]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PUBLISHED = ("Published beside (their own hardware, their own held-out sets, no noise floor stated): BLIS "
             "(inference-sim), a twin of vLLM on 36 held-out configurations, median error E2E 6.7 %, TTFT 17.6 %, "
             "ITL 7.1 %; Vidur, under 9 % error on end-to-end latency; LLMServingSim 2.0, about 2 % once its KV "
             "capacity is matched to vLLM's.")


def _pct(x) -> str:
    return "–" if x is None or x != x else f"{100 * x:.1f} %"


def _twin_verdict(m: dict) -> str:
    limit = twin_limit(m["metric"], m["noise_median"])
    if limit is None:
        return "–"
    return f"≤ {_pct(limit)}: " + ("**yes**" if m["error_median"] <= limit else "no")


def _twin_profile(d: dict) -> list[str]:
    p = d["profile"]
    g, lim = p["grid"], p["limits"]
    said = "; ".join(f"{k} {v['value']} ({v['source']})" for k, v in lim.items())
    return [f"Profile (`{d['conditions']['quiet']['profiled']['command']}`, 1-minute load "
            f"{p['load_1min'][0]:.1f}–{p['load_1min'][1]:.1f}): batch sizes {g['batch_sizes']}, contexts "
            f"{g['contexts']}, prompts {g['prompts']}" + (f", crowds {g['crowds']}" if g.get("crowds") else "")
            + f", {g['repeats']} repeats; {p['fit_samples']} steps fitted" + _terms(g, p) + " with "
            f"{_pct(p['fit_rms_rel_error'])} rms relative error; decode step {1e3 * p['decode_step_s_at_1']:.2f} ms at "
            f"one row; " + _front(p) + f". Limits read: {said}."]


def _terms(g: dict, p: dict) -> str:
    """The opt-in step-time terms the fit was asked to use, and the one it found where recorded."""
    if not g.get("terms"):
        return ""
    found = (f" ({1e9 * p['dense_s_per_pair']:.3f} ns per query × key read)"
             if p.get("dense_s_per_pair") is not None else "")
    return f" (opt-in term: {', '.join(g['terms'])}{found})"


def _front(p: dict) -> str:
    """The profile's front-end readings, and what the twin charges for them."""
    fe, beside = p.get("front_end_priced"), p.get("frontend_beside_s")
    if fe:
        return (f"front end read idle {1e3 * p['frontend_s']:.1f} ms per request" +
                ("" if beside is None else f", {1e3 * beside:.1f} ms before the scheduler beside a stream")
                + _priced(fe) + _handed(p.get("hand_over")))
    return f"front end {1e3 * p['frontend_s']:.1f} ms per request" + (
        "" if beside is None else
        f" (a prompt sent beside a stream: {1e3 * beside:.1f} ms before the scheduler; what it "
        "holds beyond the front end delays each request off the engine)")


def _handed(ho: dict | None) -> str:
    """What the hand-over probe read and what its fit found, as a clause of the profile line."""
    if not ho:
        return ""
    pr = ho["probe"]
    return (f"; of {pr['requests']} prompts of {pr['prompt']} tokens sent at once, the server computed the prompts in "
            f"{described(ho['server'], pr)} (its own count, round by round), the twin at that price in "
            f"{described([ho['twin_priced']], pr)}; {handed(ho)}")


def _priced(fe: dict | None) -> str:
    """The front end the arrival probe priced, as a clause of the profile line."""
    if not fe:
        return ""
    if not isinstance(next(iter(fe["server_s"].values())), dict):      # one stream count, read from two runs
        costs = ", ".join(f"{p}-token prompts {1e3 * v:.1f} ms on the server, {1e3 * fe['twin_s'][p]:.1f} ms on its "
                          "steps alone" for p, v in fe["server_s"].items())
        return (f"; an arrival among {fe['probe']['streams'][0]} streams cost ({costs}), so the twin's front end "
                f"takes {1e3 * fe['engine_s']:.2f} ms + {1e6 * fe['engine_s_per_token']:.1f} µs a prompt token of the "
                f"engine and delays each request {1e3 * fe['delay_s']:.1f} ms besides")
    costs = "; ".join(f"among {n}: " + ", ".join(f"{p} tokens {1e3 * v:.1f} ms ({1e3 * fe['twin_s'][n][p]:.1f})"
                                                 for p, v in by_prompt.items())
                      for n, by_prompt in fe["server_s"].items())
    return (f"; what an arrival cost the running streams on the server, read inside one run (on the twin's steps "
            f"alone): {costs}; so the twin's front end takes {1e3 * fe['engine_s']:.2f} ms + "
            f"{1e6 * fe['engine_s_per_token']:.1f} µs a prompt token + {1e6 * fe['engine_s_per_row']:.0f} µs a "
            f"running row of the engine and delays each request {1e3 * fe['delay_s']:.1f} ms besides")


def _twin_validate(cond: str, v: dict) -> list[str]:
    rates = "; ".join(f"`{w}` {r}" for w, r in v["rates"].items())
    lines = [f"**{cond}** (`{v['command']}`; req/s {rates}; {v['cells']} cells):", "",
             "| metric | cells | twin error (abs.), median / P90 | rerun floor, median / P90 | twin below / above "
             "the server | target (median) |", "|---|---|---|---|---|---|"]
    signs = v["signs"]
    for m in v["metrics"]:
        s = signs.get(m["metric"])
        side = f"{s['below']:.0%} / {s['above']:.0%}" if s else "–"
        lines.append(f"| {METRIC_NAMES.get(m['metric'], m['metric'])} | {m['cells']} | {_pct(m['error_median'])} / "
                     f"{_pct(m['error_p90'])} | {_pct(m['noise_median'])} / {_pct(m['noise_p90'])} | {side} | "
                     f"{_twin_verdict(m)} |")
    lines += ["", f"90 % intervals held **{_pct(v['coverage'])}** of the cells (target 85–95 %). Drift (a reference "
              f"burst timed around each workload's runs, against {_drift_baseline(v['drift'])}): {_drifts(v['drift'])}."]
    if v.get("uncorrected"):
        plain = "; ".join(f"{METRIC_NAMES.get(k, k)} {_pct(e['error_median'])}" for k, e in v["uncorrected"].items())
        corrections = ("drift, live and first-token corrections" if (v.get("live") or {}).get("first_token")
                       else "drift and live corrections" if v.get("live") else "drift correction")
        lines += [f"Without the {corrections}, the median errors are {plain}."]
    return lines + _by_workload(v.get("by_workload")) + _live(v.get("live")) + _without_live(v.get("without_live"))


def _drift_baseline(drift: dict) -> str:
    """What a validation's drift factors divide by, as its record says (older records: the profile)."""
    against = {x.get("against") for f in drift.values() for x in f.values()}
    return {frozenset({"profile time"}): "the profile's timing of it",
            frozenset({"prediction"}): "the fit's replay of it"}.get(frozenset(against), "the profile")


def _on_drift(pooled: dict) -> str:
    """' on the drift probe's 1.28×' where the live profile also carries the drift the replays ran at."""
    return f" on the drift probe's {pooled['drift']:.2f}×" if pooled.get("drift", 1.0) != 1.0 else ""


def _drifts(drift: dict) -> str:
    """Each workload's drift factor, and where the replays were not scaled by it (left out by the
    gate, or `validation.drift: measure`); a record made before the gate does not say."""
    def one(f: dict) -> str:
        first = f[next(iter(f))]
        notes = ([f"{first['vs_prediction']:.2f}× against the fit's replay"] if "vs_prediction" in first else []) + (
            ["not applied"] if all(x.get("applied") is False for x in f.values()) else [])
        return f"{first['factor']:.2f}×" + (f" ({', '.join(notes)})" if notes else "")
    return ", ".join(f"`{w}` {one(f)}" for w, f in drift.items())


def _by_workload(by: dict | None) -> list[str]:
    """Signed median error per workload: where the residual lives (absent in records made before it was kept)."""
    if not by:
        return []
    keys = ("e2e_p50", "ttft_p50", "tpot_p50")
    each = "; ".join(f"`{w}` " + " / ".join(f"{100 * per[k]['median_error']:+.1f} %" if k in per else "–" for k in keys)
                     for w, per in by.items())
    return ["", f"Signed median error by workload ({' / '.join(METRIC_NAMES[k] for k in keys)}; + : the twin above "
                f"the server): {each}."]


def _errors(v: dict) -> str:
    """'p50 E2E 12.5 % (below the server in 75%); ...': a validation's median errors and signs."""
    return "; ".join(f"{METRIC_NAMES.get(m['metric'], m['metric'])} {_pct(m['error_median'])}"
                     + (f" (below the server in {v['signs'][m['metric']]['below']:.0%})" if m["metric"] in v["signs"] else "")
                     for m in v["metrics"])


def _without_live(w: dict | None) -> list[str]:
    """The same runs replayed with the drift probe alone: what the live (and first-token) factor earns."""
    if not w:
        return []
    return ["", f"The same replays with the drift probe alone: median error {_errors(w)}; "
            f"intervals held {_pct(w['coverage'])}."]


def _twin_earlier(cond: dict) -> list[str]:
    """The same real runs replayed on an earlier twin (another placement of the front end, say)."""
    lines = []
    rates = cond.get("validate", {}).get("rates")
    for e in cond.get("earlier_validations", []):
        if "rates" not in e:      # recorded before the rates were: which runs cannot be told from the file
            runs = "Earlier real runs (their rates not recorded)"
        elif e["rates"] == rates:
            runs = "The same runs"
        else:
            runs = "Earlier real runs (req/s " + "; ".join(f"`{w}` {r}" for w, r in e["rates"].items()) + ")"
        how = (" (with the live factor" + ("" if "estimator" in e["live"] else " taken as x alone, before its sensitivity") + ")"
               if e.get("live") else "")
        lines += ["", f"{runs} replayed on `{e.get('twin', 'twin.yaml')}` (`{e['command']}`): median error {_errors(e)}; "
                  f"intervals held {_pct(e['coverage'])}{how}."]
    return lines


def _twin_knee(conds: dict) -> list[str]:
    probed = any("predicted_at_probe" in c.get("knee", {}) for c in conds.values())
    lines = ["| machine | server sustains (each search: held / failed) | twin predicts (held / failed) | "
             "twin / server | within 10 % | twin scaled by the drift (held / failed; twin / server) | "
             "twin scaled by the contention (held / failed; twin / server) | "
             "twin on the validation's live profile (held / failed; twin / server) |"
             + (" twin scaled to the server's burst before the searches (held / failed; twin / server) |" if probed else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if probed else "")]
    made: list[str] = []
    for cond, c in conds.items():
        if "knee" not in c:
            continue
        k = c["knee"]
        held = [m["sustained_rate"] for m in k["measured"] if m.get("sustained_rate")]
        pred = k["predicted"]["sustained_rate"]
        searches = ", ".join(f"{m.get('sustained_rate')} / {m.get('failed_rate')}" for m in k["measured"])
        ratio = pred / statistics.median(held) if held and pred else None
        made.append(f"{cond}: {_made_by(k)}" + "".join(
            f"; before it, `{e['by']}` predicted {e['sustained_rate']} / {e['failed_rate']}" for e in k.get("earlier_predictions", [])))
        lines.append(f"| {cond} | {searches} | {pred} / {k['predicted']['failed_rate']} | "
                     f"{'–' if ratio is None else f'{ratio:.2f}'} | "
                     f"{'–' if ratio is None else ('**yes**' if abs(ratio - 1) <= 0.10 else 'no')} | "
                     f"{_scaled(k.get('predicted_at_drift'), held)} | {_scaled(k.get('predicted_at_contention'), held)} | "
                     f"{_scaled(k.get('predicted_at_live'), held)} |"
                     + (f" {_scaled(k.get('predicted_at_probe'), held)} |" if probed else ""))
    return lines + ["", "Made by " + "; ".join(made) + "."] if made else lines


def _scaled(p: dict | None, held: list[float]) -> str:
    """The knee of the twin with its steps scaled by a factor measured on the machine: the drift of
    the validation's reference bursts, or the contention others brought to the server's cores."""
    if not p or not held:
        return "–"
    return (f"×{p['factor']:.2f}: {p['sustained_rate']} / {p['failed_rate']}; "
            f"{p['sustained_rate'] / statistics.median(held):.2f}")


SERVER_NAMES = {"vllm": "vLLM", "transformers": "transformers serve", "batchlab": "batchlab serve"}


def _twin_whatif(w: dict, server: str = "vllm") -> list[str]:
    b = w["burst"]
    how = (f"started at each other sequence cap beside a second at cap {w['caps'][0]['cap']}, {w['pairs']} pairs of "
           f"bursts alternating between the two (ABBA order)" if "pairs" in w else
           f"restarted at each sequence cap, {_times(len(w['caps'][0]['measured']))}")
    lines = [f"What-if ({_made_by(w)}): a burst of {b['requests']} requests ({b['prompt']} + {b['output']} "
             f"tokens) on {SERVER_NAMES[server]} {how}, against the twin of the one profile:", "",
             "| cap | measured tok/s | twin tok/s | error | measured p50 TPOT | twin p50 TPOT | error |",
             "|---|---|---|---|---|---|---|"]
    for c in w["caps"]:
        toks = [r["tok_s"] for r in c["measured"]]
        tpots = [1e3 * r["tpot_p50"] for r in c["measured"]]
        p = c["predicted"]
        lines.append(f"| {c['cap']} | {', '.join(f'{x:.0f}' for x in toks)} | {p['tok_s']:.0f} | "
                     f"{_signed(p['tok_s'] / statistics.median(toks) - 1)} | {', '.join(f'{x:.1f}' for x in tpots)} ms | "
                     f"{1e3 * p['tpot_p50']:.1f} ms | {_signed(1e3 * p['tpot_p50'] / statistics.median(tpots) - 1)} |")
    for i, e in enumerate(w["caps"][0].get("earlier_predictions", [])):
        caps = [(c["cap"], c["earlier_predictions"][i]) for c in w["caps"]]
        lines += ["", f"Predicted before by `{e['by']}`: " + "; ".join(
            f"cap {cap} {p['tok_s']:.0f} tok/s, p50 TPOT {1e3 * p['tpot_p50']:.1f} ms" for cap, p in caps) + "."]
    return lines + ["", _twin_direction(w["caps"])] + _beside(w["caps"][1:]) + _steps(w["caps"], server)


def _steps(caps: list[dict], server: str) -> list[str]:
    """The engine steps each cap's bursts took on the server (its /metrics' per-step count) against
    the twin's, and of them the steps that computed prompts, where counted: a scheduling difference,
    apart from what each step costs; and the median gap between two tokens, the typical decode
    step, where measured."""
    name, lines = SERVER_NAMES[server], []
    counted = [c for c in caps if "steps" in c["predicted"] and all("steps" in r for r in c["measured"])]
    if counted:
        lines += ["", f"Engine steps per burst, {name}'s own count (its /metrics) against the twin's: " + "; ".join(
            f"cap {c['cap']} {_spread([r['steps'] for r in c['measured']], '{:.0f}')} against {c['predicted']['steps']} "
            f"({c['predicted']['steps'] / statistics.median(r['steps'] for r in c['measured']):.2f}×)" for c in counted) + "."]
    sized = [c for c in counted if "step_sizes" in c["predicted"] and all("step_sizes" in r for r in c["measured"])]
    if sized:
        lines += ["", "Of them, the steps that computed more tokens than the cap (prompts beside the decoding rows): " + "; ".join(
            f"cap {c['cap']} {_spread([steps_over(r['step_sizes'], c['cap']) for r in c['measured']], '{:.0f}')} against "
            f"{steps_over(c['predicted']['step_sizes'], c['cap'])}" for c in sized) + "."]
    if all("gap_p50" in r for c in caps for r in c["measured"]) and all("gap_p50" in c["predicted"] for c in caps):
        lines += ["", "Median gap between two tokens (a burst's typical decode step; p50 TPOT also carries the prompt "
                  "steps): " + "; ".join(
                      f"cap {c['cap']} {_spread([1e3 * r['gap_p50'] for r in c['measured']], '{:.1f}')} ms against "
                      f"{1e3 * c['predicted']['gap_p50']:.1f} ms" for c in caps) + "; " + "; ".join(
                      f"cap {c['cap']}'s change {_signed(measured_change(c, caps[0], 'gap_p50')[0])} measured, "
                      f"{_signed(c['predicted']['gap_p50'] / caps[0]['predicted']['gap_p50'] - 1)} twin" for c in caps[1:]) + "."]
    return lines


def _beside(caps: list[dict]) -> list[str]:
    """What the waiting server of a pair took from the shared core while the other ran its burst."""
    runs = [r for c in caps for r in c["measured"] + c.get("control", []) if "beside_cpu_s" in r]
    if not runs:
        return []
    shares = [r["beside_cpu_s"] / r["wall_s"] for r in runs]
    return ["", f"While one server of a pair ran its burst, the waiting one took {100 * statistics.median(shares):.1f} % "
                f"of a core (median over {len(runs)} bursts; {100 * min(shares):.1f} to {100 * max(shares):.1f} %)."]


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _twin_direction(caps: list[dict]) -> str:
    """Each other cap against the first (the profile's own): the change the server showed and the twin's."""
    parts = []
    for c in caps[1:]:
        for key, name in (("tok_s", "throughput"), ("tpot_p50", "p50 TPOT")):
            real, spread = _measured_change(c, caps[0], key)
            twin = c["predicted"][key] / caps[0]["predicted"][key] - 1
            parts.append(f"cap {c['cap']} {name} {_signed(real)} measured{spread}, {_signed(twin)} twin "
                         f"({'same direction' if real * twin > 0 else 'OPPOSITE direction'}; "
                         f"{_against_change(twin, real)})")
    return f"Against cap {caps[0]['cap']}: " + "; ".join(parts) + "."


def _measured_change(c: dict, first: dict, key: str) -> tuple[float, str]:
    """The server's change from the first cap (twin_check.measured_change), with its pairs' range."""
    change, pairs = measured_change(c, first, key)
    return change, f" (pairs {_signed(min(pairs))} to {_signed(max(pairs))})" if pairs else ""


def _against_change(twin: float, real: float) -> str:
    """The twin's change over the server's: within 15 % of it is the what-if's target."""
    return f"the twin's change {twin / real:.2f}× the server's" if real else "no change measured"


def _made_by(part: dict) -> str:
    """The command that measured a part, and the one that predicted it when that was a later one."""
    if "measured_by" in part:
        return f"server: `{part['measured_by']}`; twin: `{part['command']}`"
    return f"`{part['command']}`"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f} %"


def twin(d: dict) -> str:
    """A twin of a server (vLLM, transformers serve, batchlab serve) against the server: the profile,
    held-out accuracy per machine condition, the knee and the what-if; the published twins beside."""
    conds = d["conditions"]
    if "profile" in d:
        lines = _twin_profile(d) + [""]
    else:
        first = next(part for c in conds.values() for part in c.values() if isinstance(part, dict) and "twin" in part)
        lines = [f"No profile in this record: its twin `{first['twin']}` (profile {first['profile']}) was profiled before it.", ""]
    for cond in ("quiet", "busy"):
        if "validate" in conds.get(cond, {}):
            lines += _twin_validate(cond, conds[cond]["validate"]) + _twin_earlier(conds[cond]) + [""]
    if any("knee" in c for c in conds.values()):
        lines += ["Sustained rate under the SLO (TTFT p99 ≤ "
                  f"{d['slo']['ttft_s']:g} s, TPOT p99 ≤ {1e3 * d['slo']['tpot_s']:g} ms), searched the same way on both:", ""]
        lines += _twin_knee(conds) + [""]
    if "whatif" in conds.get("quiet", {}):
        lines += _twin_whatif(conds["quiet"]["whatif"], d.get("server", "vllm")) + [""]
    if "sizes" in conds.get("quiet", {}):
        lines += _twin_sizes(conds["quiet"]["sizes"], d.get("server", "vllm")) + [""]
    return "\n".join(lines + [PUBLISHED])


def _twin_sizes(s: dict, server: str) -> list[str]:
    """Bursts of several sizes on the server and on the twin, each over its whole span: where the
    twin leaves the batch sizes its profile timed."""
    b, name = s["burst"], SERVER_NAMES.get(server, server)
    lines = [f"Bursts of each size at once on {name} and on its twin (`{s['command']}`; {b['prompt']} + {b['output']} "
             f"tokens a request; output tok/s from the first arrival to the last token; the median gap between two "
             f"tokens of a request, its typical decode step; the profile timed decode bursts of "
             f"{', '.join(map(str, s['batch_sizes_profiled']))} requests; 1-minute load {s['load_1min_after']:.1f} after):", "",
             "| requests at once | measured tok/s | twin tok/s | twin / measured | measured median gap | twin median gap |",
             "|---|---|---|---|---|---|"]
    for row in s["sizes"]:
        got, pred = row["measured"], row["predicted"]
        tok = statistics.median(r["span_tok_s"] for r in got)
        toks = ", ".join(f"{r['span_tok_s']:,.0f}" for r in got)
        gaps = ", ".join(f"{1e3 * r['gap_p50']:.1f}" for r in got)
        lines.append(f"| {row['requests']} | {toks} | {pred['span_tok_s']:,.0f} | {pred['span_tok_s'] / tok:.2f}× | "
                     f"{gaps} ms | {1e3 * pred['gap_p50']:.1f} ms |")
    if all("rows_mean" in r for row in s["sizes"] for r in [*row["measured"], row["predicted"]]):
        lines += ["", *_sizes_anatomy(s["sizes"], name)]
    if all("intake_gap" in r for row in s["sizes"] for r in [*row["measured"], row["predicted"]]):
        lines += ["", *_sizes_phases(s["sizes"])]
    return lines


def _sizes_phases(sizes: list[dict]) -> list[str]:
    """Each burst's intake (its first first token to its last) against what follows (decoding
    only): rows decoding at once, and the mean gap between two tokens per row of them."""
    def cell(r: dict, part: str) -> str:
        rows, gap = r[f"{part}_rows"], r[f"{part}_gap"]
        return "–" if not rows == rows or not rows > 0 else f"{rows:.0f} · {1e3 * gap:.0f} · {1e3 * gap / rows:.2f}"
    lines = ["The intake (from the burst's first first token to its last: steps there may compute prompts beside "
             "the running rows) against what follows it (decoding only), each as rows decoding at once · their mean "
             "gap between two tokens, ms · that gap per row, ms:", "",
             "| requests at once | intake, measured | intake, twin | after it, measured | after it, twin |",
             "|---|---|---|---|---|"]
    for row in sizes:
        got, pred = row["measured"], row["predicted"]
        lines.append(f"| {row['requests']} | {'; '.join(cell(r, 'intake') for r in got)} | {cell(pred, 'intake')} | "
                     f"{'; '.join(cell(r, 'after') for r in got)} | {cell(pred, 'after')} |")
    return lines


def _sizes_anatomy(sizes: list[dict], name: str) -> list[str]:
    """Where each burst's time went: how many decoded at once on average, when the last request got
    its first token, and the server's CPU time over the burst's wall time."""
    lines = [f"Where the time went (rows at once: each request's time from its first token to its last, summed, over "
             f"the burst's span; a burst's rate is about that over its gap between two tokens, the median gap standing in "
             f"for the mean, so the twin's rate over the server's is about its rows at once over the server's times "
             f"the server's gap over its own, and the log of each ratio "
             f"over the log of the rates' ratio is that part's share of the miss, where the rates are more than "
             f"1.25× apart; {name}'s CPU: its processes' CPU seconds over the burst's wall seconds, on its one core):", "",
             "| requests at once | rows at once, measured | twin | last first token, measured | twin | server CPU / wall "
             "| share of the miss: rows at once / step |",
             "|---|---|---|---|---|---|---|"]
    for row in sizes:
        got, pred = row["measured"], row["predicted"]
        cpu = ", ".join(f"{r['server_cpu_share']:.2f}" for r in got if "server_cpu_share" in r) or "–"
        rows = ", ".join(f"{r['rows_mean']:.0f}" for r in got)
        firsts = ", ".join(f"{r['ttft_max']:.2f}" for r in got)
        lines.append(f"| {row['requests']} | {rows} | {pred['rows_mean']:.0f} | {firsts} s | {pred['ttft_max']:.2f} s | {cpu} | "
                     f"{_miss_shares(got, pred)} |")
    return lines


def _miss_shares(got: list[dict], pred: dict) -> str:
    """How much of log(twin rate / server rate) the rows at once and the step each carry (the
    medians of the server's runs); a dash where the rates are within 1.25× (a share of nothing)."""
    miss = math.log(pred["span_tok_s"] / statistics.median(r["span_tok_s"] for r in got))
    if abs(miss) < math.log(1.25):
        return "–"
    rows = math.log(pred["rows_mean"] / statistics.median(r["rows_mean"] for r in got)) / miss
    step = math.log(statistics.median(r["gap_p50"] for r in got) / pred["gap_p50"]) / miss
    return f"{rows:.0%} / {step:.0%}"


def twin_contention(d: dict) -> str:
    """Paired saturated bursts quiet and beside a background job: the slowdown against what the
    core time the job took explains."""
    c = d["conditions"]["quiet"]["contention"]
    b, rounds = c["burst"], c["rounds"]
    sides = ("server core", "every core")
    lines = [f"`{c['command']}` ({SERVER_NAMES.get(d['server'], d['server'])} pinned to core 1, this client on core 0; {b['requests']} requests of "
             f"{b['prompt']} + {b['output']} tokens at once; the job burns {c['duty']:.0%} of each chosen core in "
             f"0.1-s periods; 1-minute load {c['load_1min_after']:.1f} after):", "",
             "| round | quiet | job on the server's core: tok/s, others' share, slowdown (share alone) "
             "| job on every core: the same |", "|---|---|---|---|"]
    for k, r in enumerate(rounds, 1):
        cells = [f"{r[n]['tok_s']:,.0f}, {r[n]['others_share']:.1%}, {r[n]['slowdown']:.2f}× ({r[n]['explained']:.2f}×)"
                 for n in sides]
        lines.append(f"| {k} | {r['quiet']['tok_s']:,.0f} tok/s | " + " | ".join(cells) + " |")
    med = lambda n, key: statistics.median(r[n][key] for r in rounds)  # noqa: E731
    label = {"server core": "the job on the server's core", "every core": "the job on every core"}
    lines += ["", "Median over rounds: " + "; ".join(
        f"{label[n]}: slowdown **{med(n, 'slowdown'):.2f}×** "
        f"({min(r[n]['slowdown'] for r in rounds):.2f}–{max(r[n]['slowdown'] for r in rounds):.2f}), the share alone "
        f"explains {med(n, 'explained'):.2f}×" for n in sides) + "."]
    return "\n".join(lines)


def twin_probe(d: dict) -> str:
    """The knee again, with a saturated burst on the server before each search and the twin scaled
    to it: the machine's speed read at the time of the question."""
    knees = any("knee" in c for c in d["conditions"].values())
    lines = _twin_knee(d["conditions"]) + [""] if knees else []
    for cond, c in d["conditions"].items():
        k = c.get("knee", {})
        probe = k.get("predicted_at_probe")
        if not probe:
            continue
        bursts = ", ".join(f"{m['probe']['tok_s']:,.0f}" for m in k["measured"] if m.get("probe"))
        lines.append(f"- {cond}: the server's bursts before the searches ran {bursts} tok/s; the twin's steps "
                     f"scaled by {probe['factor']:.2f}× to match their median (profile `{k['profile']}`).")
        held = statistics.median(m["sustained_rate"] for m in k["measured"] if m.get("sustained_rate"))
        for e in k.get("earlier_predictions", []):
            if "predicted_at_probe" in e:
                p = e["predicted_at_probe"]
                lines.append(f"- {cond}, the earlier twin (`{e['by']}`): {e['sustained_rate']} unscaled "
                             f"({e['sustained_rate'] / held:.2f}), scaled by {p['factor']:.2f}× to the same bursts "
                             f"{p['sustained_rate']} ({p['sustained_rate'] / held:.2f}).")
    return "\n".join(lines + _twin_requests(d["conditions"])).strip("\n")


def refits(d: dict) -> str:
    """One profile fitted other ways: each variant's steps by decode batch, and its twin's bursts
    at each sequence cap beside the server's."""
    names = list(d["fits"])
    lines = [f"`{d['command']}` (profile `{d['profile']}`, decode bursts of "
             f"{', '.join(map(str, d['grid']['batch_sizes']))} rows). "
             + "; ".join(f"{n}: rms error {_pct(f['fit_rms_rel_error'])}, {1e3 * f['overhead_s']:.2f} ms a step, "
                         f"{1e6 * f['prefill_s_per_token']:.1f} µs a prompt token, {1e3 * f['prefill_step_s']:.2f} ms a "
                         f"prompt pass, {1e3 * f['admit_s']:.2f} ms an admitted request, "
                         f"{1e6 * f['admit_s_per_row']:.0f} µs an arrival's running row, "
                         + (f"{1e9 * f['dense_s_per_pair']:.3f} ns a query × key read, " if f.get("dense_s_per_pair") else "")
                         + (f"{1e3 * f['beyond_s_per_row']:.2f} ms a decode row past {f['rows_profiled']}, "
                            if f.get("beyond_s_per_row") else "")
                         + f"{1e3 * f['frontend_s']:.1f} ms front end a request"
                         for n, f in d["fits"].items()) + ".", "",
             "| decode rows | steps | measured step | " + " | ".join(f"{n} | error" for n in names) + " |",
             "|---|---|---|" + "---|---|" * len(names)]
    def judged(row: dict) -> str:          # the measured median, then each variant's prediction and error
        return f"{_fine_ms(row['measured_s'])} | " + " | ".join(
            f"{_fine_ms(row['variants'][n]['predicted_s'])} | {_signed(row['variants'][n]['error'])}" for n in names) + " |"
    lines += [f"| {b['rows']} | {b['steps']} | {judged(b)}" for b in d["batches"]]
    if d.get("admissions"):
        lines += ["", "| requests admitted in a prompt step | steps | their prompt tokens | measured step (median) | "
                  + " | ".join(f"{n} | error" for n in names) + " |", "|---|---|---|---|" + "---|---|" * len(names)]
        lines += [f"| {a['admitted']} | {a['steps']} | {', '.join(map(str, a['prompt_tokens']))} | {judged(a)}"
                  for a in d["admissions"]]
    for w in d["whatif"]:
        lines += ["", *_refit_bursts(w, names)]
    for s in d.get("sizes", []):
        lines += ["", *_refit_sizes(s, names)]
    return "\n".join(lines)


def _refit_sizes(s: dict, names: list[str]) -> list[str]:
    """Bursts sent at once, each size on the server and on every variant's twin."""
    b = s["burst"]
    lines = [f"Bursts sent at once ({b['prompt']} + {b['output']} tokens a request), `{s['record']}`: output tok/s from "
             "the first arrival to the last token and the median gap between two tokens, on the server (median of "
             "its runs) and on each twin (tok/s as a multiple of the server's):", "",
             "| requests at once | server tok/s | " + " | ".join(f"{n} tok/s" for n in names) + " | server median gap | "
             + " | ".join(f"{n} gap" for n in names) + " |", "|---|---|" + "---|" * len(names) + "---|" + "---|" * len(names)]
    for row in s["sizes"]:
        m, v = row["measured"], row["variants"]
        lines.append(f"| {row['requests']} | {m['span_tok_s']:.0f} | " + " | ".join(
            f"{v[n]['span_tok_s']:.0f} ({v[n]['span_tok_s'] / m['span_tok_s']:.2f}×)" for n in names)
            + f" | {1e3 * m['gap_p50']:.1f} ms | " + " | ".join(f"{1e3 * v[n]['gap_p50']:.1f} ms" for n in names) + " |")
    return lines


def intervals(d: dict) -> str:
    """Kept validations' cells judged by each interval rule: the share held, the width, per metric."""
    rules = d["rules"]
    metrics = list(next(iter(d["validations"].values()))[rules[-1]]["by_metric"])
    lines = [f"`{d['command']}` (each validation's kept cells, nothing run again; held: the share of cells whose "
             "interval held the real value, an honest 90 % interval holds 85–95 %; width: the median over cells "
             "of step-cost's half width over the replay, of held-out's bound on the relative error):", "",
             "| validation | cells | " + " | ".join(f"{r}: held | width" for r in rules) + " | "
             + f"{rules[-1]} by metric ({', '.join(metrics)}) |",
             "|---|---|" + "---|---|" * len(rules) + "---|"]
    for name, v in d["validations"].items():
        per = v[rules[-1]]["by_metric"]
        lines.append(f"| {name} | {v[rules[0]]['cells']} | " + " | ".join(
            f"{_pct(v[r]['coverage'])} | {_pct(v[r]['width_median'])}" for r in rules) + " | "
            + " / ".join(_pct(per[m]) for m in metrics) + " |")
    lines += ["", "Mean distance of the share held from 90 %: " + "; ".join(
        f"{r} {100 * x:.1f} points" for r, x in d["mean_distance_from_90"].items()) + "."]
    return "\n".join(lines)


def _refit_bursts(w: dict, names: list[str]) -> list[str]:
    b = w["burst"]
    figures = [("tok_s", "tok/s", "throughput"), ("tpot_p50", "p50 TPOT", "p50 TPOT")]
    if "gap_p50" in w["caps"][0]["measured"]:
        figures.append(("gap_p50", "median gap between tokens", "median gap"))
    lines = [f"Bursts of {b['requests']} requests ({b['prompt']} + {b['output']} tokens), `{w['record']}`: the server at "
             "each cap (median of its runs) and each twin (error against the server):", "",
             "| cap | " + " | ".join(f"server {head} | " + " | ".join(names) for _, head, _ in figures) + " |",
             "|---|" + ("---|" * (1 + len(names))) * len(figures)]
    for c in w["caps"]:
        m, v = c["measured"], c["variants"]
        cells = [f"{_refit_figure(key, m[key])} | " + " | ".join(
            f"{_refit_figure(key, v[n][key])} ({_signed(v[n][key] / m[key] - 1)})" for n in names) for key, _, _ in figures]
        lines.append(f"| {c['cap']} | " + " | ".join(cells) + " |")
    if all("steps" in c["measured"] for c in w["caps"]):
        lines += ["", "Engine steps per burst (the server's own count, from its /metrics), and of them the steps that "
                  "computed more tokens than the cap (prompts beside the decoding rows): " + "; ".join(
                      f"cap {c['cap']} {c['measured']['steps']:.0f} and {c['measured']['prompt_steps']:.0f} on the server, "
                      + ", ".join(f"{c['variants'][n]['steps']} and {c['variants'][n]['prompt_steps']} {n}" for n in names)
                      for c in w["caps"]) + "."]
    for c in w["caps"]:
        if c["cap"] != w["base_cap"]:
            ch = c["change"]
            lines += ["", f"Cap {c['cap']} against cap {w['base_cap']}: " + "; ".join(
                f"{what} {_signed(ch['measured'][key])} on the server, " + ", ".join(
                    f"{_signed(ch[n][key])} {n}" for n in names)
                for key, _, what in figures) + "."]
    return lines


def _refit_figure(key: str, value: float) -> str:
    return f"{value:.0f}" if key == "tok_s" else _fine_ms(value)


def _fine_ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f} ms"


def twin_rows(d: dict) -> str:
    """What one arrival costs a server's running streams by how many run, one at a time and in
    clumps: read from two runs (alone, with the arrivals) and inside the one, beside the twin and
    its steps without a front end."""
    lines = []
    for cond, c in d["conditions"].items():
        r = c.get("rows")
        if not r:
            continue
        lines += [f"{cond} (`{r['command']}`; {len(r['rounds'])} rounds on the server, each in another order; twin "
                  f"`{r['twin']}`): what one arrival ({r['short'][0]}-token prompt unless said, {r['short'][1]} tokens) "
                  "adds to the running streams' time, the median over rounds (their range), read from two runs (the "
                  "streams alone, then with the arrivals) and inside the run with them; the twin, and its fitted "
                  "steps with no front end:", "",
                  "| streams | arrivals | server, two runs | server, inside one | twin | its steps alone | "
                  "inside one less the steps |", "|---|---|---|---|---|---|---|"]
        for key in sorted(r["predicted"], key=lambda x: (int(x.split("x")[0]), x.count("x"), x)):
            n, k, *prompt = key.split("x")
            what = ("one at a time" if k == "1" else f"in clumps of {k}") + (f", {prompt[0]}-token prompts" if prompt else "")
            inside = statistics.median(x[key] for x in r["rounds_within"])
            lines.append(f"| {n} | {what} | {_over_rounds(r['rounds'], key)} | {_over_rounds(r['rounds_within'], key)} | "
                         f"{1e3 * r['predicted'][key]:.1f} ms | {1e3 * r['predicted_steps'][key]:.1f} ms | "
                         f"**{1e3 * (inside - r['predicted_steps'][key]):+.1f} ms** |")
    return "\n".join(lines)


def _over_rounds(rounds: list[dict], key: str) -> str:
    xs = [x[key] for x in rounds]
    return f"{1e3 * statistics.median(xs):.1f} ms ({1e3 * min(xs):.1f} to {1e3 * max(xs):.1f})"


def twin_whatif(d: dict) -> str:
    """The what-if alone: the server restarted at other caps against the twin of one profile."""
    w = d["conditions"]["quiet"]["whatif"]
    warm = w.get("warm_bursts", 0)
    head = [f"Each server sent {warm} saturated bursts, unrecorded, before its measured ones.", ""] if warm else []
    return "\n".join(head + _twin_whatif(w, d.get("server", "vllm"))).strip("\n")


def twin_alternate(d: dict) -> str:
    """Base traffic and a held-out workload alternately on one server from its start, each trace
    also on the twin: per point, and the workloads' ratio on both over the later pairs."""
    lines = []
    for cond, c in d["conditions"].items():
        a = c.get("alternate")
        if not a:
            continue
        w, pts = a["with"], a["points"]
        hosted = all("host" in p for p in pts)
        rates = {p["workload"]: p["rate"] for p in pts}
        warm = a.get("warm_bursts", 0)
        after = f" after {warm} saturated warm-up bursts" if warm else ""
        lines += [f"`{w}` and `base` alternately on {SERVER_NAMES[d.get('server', 'vllm')]} from its start{after} ({cond}; "
                  f"`{a['command']}`; req/s `base` {rates['base']:g}, `{w}` {rates[w]:g}; twin `{a['twin']}`):", "",
                  "| point | workload | started after | server p50 TPOT | twin p50 TPOT | twin / server | stood still "
                  "(gaps ≥ 30 ms mid-decode): server; twin | server kernel time | page faults |"
                  + (" stolen | host probe: interpreter; product |" if hosted else ""),
                  "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if hosted else "")]
        for i, p in enumerate(pts):
            sv, tw, u = p["server"], p["twin"], p.get("usage")
            kernel, faults = (f"{u['system_s']:.1f} s", f"{u['minor_faults']:,}") if u else ("–", "–")
            row = (f"| {i + 1} | `{p['workload']}` | {p['server_age_s']:.0f} s | {1e3 * sv['tpot_p50']:.2f} ms | "
                   f"{1e3 * tw['tpot_p50']:.2f} ms | {tw['tpot_p50'] / sv['tpot_p50']:.2f} | {sv['stalled_s']:.2f} s "
                   f"({sv['stalls']}); {tw['stalled_s']:.2f} s ({tw['stalls']}) | {kernel} | {faults} |")
            if hosted:
                h = p["host"]
                row += f" {p['stolen_s']:.2f} s | {1e3 * h['python_s']:.1f}; {1e3 * h['matmul_s']:.1f} ms |"
            lines.append(row)
        by = a["summary"]
        said = "; ".join(f"{METRIC_NAMES[k]} **{v['server_ratio']:.2f}×** on the server, **{v['twin_ratio']:.2f}×** "
                         f"on the twin" for k, v in by.items())
        t = by["tpot_p50"]
        lines += ["", f"Over the {len(t['pairs']) - 1} pairs after the first, `{w}` over `base` (median): {said}. The "
                  f"twin's p50 TPOT over the server's: {t['base_twin_over_server']:.2f} on `base`, "
                  f"{t['other_twin_over_server']:.2f} on `{w}`. The first point, "
                  f"{'after the warm-up' if warm else 'on the fresh server'}, ran "
                  f"{t['first_base_over_next']:.2f}× the next `base` point's p50 TPOT.", ""]
    return "\n".join(lines).strip("\n")


def per_request(d: dict) -> str:
    """A kept validation's real runs request by request against the twin without corrections."""
    labels = list(next(iter(next(iter(d["workloads"].values())).values()))["clumps"])
    lines = [f"`{d['command']}` (twin `{d['twin']}`, no corrections): the median over requests of twin / server "
             f"TPOT, over all, by how many requests arrived within {1e3 * d['clump_s']:.0f} ms of each (itself "
             "included), and by thirds of the run:", "",
             "| workload | req/s | requests | all | " + " | ".join(f"clump {k}" for k in labels) + " | thirds |",
             "|---|---|---|---|" + "---|" * len(labels) + "---|"]
    for w, points in d["workloads"].items():
        for rate, f in points.items():
            cells = [f"{c['ratio']:.2f} ({c['requests']})" if c["requests"] else "–" for c in f["clumps"].values()]
            lines.append(f"| `{w}` | {rate} | {f['requests']} | **{f['ratio']:.2f}** | " + " | ".join(cells)
                         + f" | {', '.join(f'{x:.2f}' for x in f['thirds'])} |")
    return "\n".join(lines + _in_flight(d))


def _in_flight(d: dict) -> list[str]:
    """The same ratios by how many requests were on the server while each decoded (files that have them)."""
    first = next(iter(next(iter(d["workloads"].values())).values()))
    if "in_flight" not in first:
        return []
    labels = list(first["in_flight"])
    lines = ["", "The same ratios by how many requests were on the server, on average, while each decoded:", "",
             "| workload | req/s | " + " | ".join(f"{k} in flight" for k in labels) + " |",
             "|---|---|" + "---|" * len(labels)]
    for w, points in d["workloads"].items():
        for rate, f in points.items():
            cells = [f"{c['ratio']:.2f} ({c['requests']})" if c["requests"] else "–" for c in f["in_flight"].values()]
            lines.append(f"| `{w}` | {rate} | " + " | ".join(cells) + " |")
    return lines


def beside_rows(d: dict) -> str:
    """A black-box profile's prompts beside 1, 4 and 16 decoding streams, fitted with and without
    the prompt-token x decode-row term."""
    w, wo = d["fits"]["with"], d["fits"]["without"]
    lines = [f"`{d['command']}`: every prefill step the profile measured, and what the step model "
             "predicts for it fitted with every term and with the prompt-token × decode-row term held at zero "
             f"(fitted: {1e9 * w['coefficients']['mix_s_per_token_row']:.1f} ns per prompt token and row; "
             f"whole fit rms {100 * w['fit_rms_rel_error']:.1f} % against {100 * wo['fit_rms_rel_error']:.1f} %):", "",
             "| streams | prompts | prompt tokens | streams' context | measured ms | with the term | without |",
             "|---|---|---|---|---|---|---|"]
    for r in d["prefill"]:
        lines.append(f"| {r['streams']:.0f} | {r['prompts']:.0f} | {r['prompt_tokens']:.0f} | "
                     f"{r.get('streams_context', 0):.0f} | {1e3 * r['measured_s']:.2f} | {1e3 * r['with_s']:.2f} | "
                     f"{1e3 * r['without_s']:.2f} |")
    errs = "; ".join(f"beside {b}: {100 * e['with']:.1f} % / {100 * e['without']:.1f} %"
                     for b, e in d["prefill_error_by_streams"].items())
    lines += ["", f"Median error of the prefill steps, with / without the term: {errs}."]
    if "arrival_costs" in d:
        c = d["arrival_costs"]
        lines += ["", f"On the twin (`{d['twin']}`), one arrival among 16 decoding streams costs them "
                  f"{1e3 * c['with']['arrival_s']:.1f} ms with the term ({1e3 * c['without']['arrival_s']:.1f} without), "
                  f"a 384-token prompt {1e3 * c['with']['long_arrival_s']:.1f} ms "
                  f"({1e3 * c['without']['long_arrival_s']:.1f} without)."]
    return "\n".join(lines)


def _twin_requests(conditions: dict) -> list[str]:
    """What one request costs the others, per round on the server and on the twin."""
    out = []
    for cond, c in conditions.items():
        r = c.get("requests")
        if not r:
            continue
        rounds, twin = r["rounds"], r["predicted"]
        med = lambda k: statistics.median(x[k] for x in rounds)  # noqa: E731
        ms = lambda k: ", ".join(f"{round(1e3 * x[k], 1) + 0.0:.1f}" for x in rounds)  # noqa: E731
        out += ["", f"What one request costs the others ({cond}; `{r['command']}`, {len(rounds)} rounds; twin "
                f"`{r['twin']}`): an arrival among 16 decoding streams adds **{1e3 * med('arrival_s'):.1f} ms** "
                f"({med('arrival_steps'):.2f} steps) to their decode on the server (median; per round {ms('arrival_s')} ms), "
                f"**{1e3 * twin['arrival_s']:.1f} ms** ({twin['arrival_steps']:.2f} steps) on the twin; a finish adds "
                f"**{round(1e3 * med('finish_s'), 1) + 0.0:.1f} ms** to the next step on the server (per round {ms('finish_s')} ms), "
                f"{round(1e3 * twin['finish_s'], 1) + 0.0:.1f} ms on the twin."]
        if "growth_per_100_share" in twin:
            out[-1] += (f" Over the streams' decode alone a step grew by **{100 * med('growth_per_100_share'):.1f} %** "
                        f"per 100 tokens of context on the server ({1e3 * med('growth_per_100_s'):.2f} ms on a "
                        f"{1e3 * med('step_at_start_s'):.1f}-ms step; median), **{100 * twin['growth_per_100_share']:.1f} %** "
                        f"on the twin ({1e3 * twin['growth_per_100_s']:.2f} ms on {1e3 * twin['step_at_start_s']:.1f} ms).")
        def cost(p: str) -> str:
            """A probe variant's cost per arrival: on the server (median and per round), on the twin."""
            return (f"**{1e3 * med(p + 'arrival_s'):.1f} ms** each ({med(p + 'arrival_steps'):.2f} steps) on the server "
                    f"(median; per round {ms(p + 'arrival_s')} ms), **{1e3 * twin[p + 'arrival_s']:.1f} ms** "
                    f"({twin[p + 'arrival_steps']:.2f} steps) on the twin.")
        if "clump_arrival_s" in twin:
            out[-1] += f" The same arrivals {twin.get('clump_size') or twin['clump']} at a time add {cost('clump_')}"
        if "stay_arrival_s" in twin:
            out[-1] += f" {twin['stay_size']} at a time that stay for {twin['stay_output']} tokens each add {cost('stay_')}"
        if "long_arrival_s" in twin:
            out[-1] += f" One by one with {twin['long_prompt']}-token prompts they add {cost('long_')}"
    return out


def roofline_check(d: dict) -> str:
    e = d["efficiency"]
    lines = [f"`{d['command']}` (arithmetic on the catalog's datasheet figures at the stated efficiencies: "
             f"{e['bandwidth']:g} of peak bandwidth, {e['flops']:g} of peak FLOP/s, {e['overhead_s'] * 1e3:g} ms per "
             "step; nothing runs):", "",
             "| published measurement | measured tok/s per stream | roofline | roofline / measured | assumed |",
             "|---|---|---|---|---|"]
    for c in d["checks"]:
        lines.append(f"| [{c['label']}]({c['source']}) | {1e3 / c['measured_ms_per_token']:.1f} | "
                     f"{1e3 / c['predicted_ms_per_token']:.1f} | **{c['ratio_predicted_over_measured_tok_s']:.2f}×** | "
                     f"{c['dtype']}, {c['context']:,} tokens of context: {c['assumed']} |")
    ratios = [c["ratio_predicted_over_measured_tok_s"] for c in d["checks"]]
    m = d["memory_table"]
    rows = next(iter(m["rows"].values()))
    lines += ["", f"Roofline over measured: {min(ratios):.2f}–{max(ratios):.2f}× across the {len(ratios)} figures "
              f"(within 25 %: {sum(abs(r - 1) <= 0.25 for r in ratios)} of {len(ratios)}).", "",
              f"The padded-batch memory limit on an {m['gpu']} ({m['new_tokens']} new tokens, a {m['reserve_gib']:g} GiB "
              "reserve, every row padded to the longest prompt P_max):", "",
              "| model | " + " | ".join(f"P_max {p}" for p in rows) + " |", "|---|" + "---|" * len(rows)]
    for name, row in m["rows"].items():
        lines.append(f"| {name} | " + " | ".join(f"{b:,} rows" for b in row.values()) + " |")
    return "\n".join(lines)


def _size_line(r: dict) -> str:
    p = r["pick"]
    cost = f"${p['usd_per_hour']:,.2f}/h" if r["pick"].get("gpu") else f"{p['gpus']} GPUs"
    return (f"{p['replicas']} × {p['device']} at cap {p['cap']} ({cost}): {r['space']:,} settings in the search, "
            f"{r['judged']} judged, {r['simulated']} simulated, **{r['wall_s']:.0f} s** (1-minute load after: "
            f"{r['load_1min_after']:.1f})")


def size_search(d: dict) -> str:
    linear, local, ray = d["linear"], d["local"], d["ray"]
    t = local["traffic"]
    fewer = "; ".join(f"cap {s['cap']}: {', '.join(s['why'])}" for s in sorted(linear["fewer"], key=lambda s: s["cap"]))
    lines = [f"`{d['command']}` ({_load(d)}):", "",
             f"- A back-of-the-envelope sizing, 25 ms + 0.4 ms per running sequence at 40 req/s of 200-token answers "
             f"(`{linear['command']}`): picks **{linear['pick']['replicas']} replicas at cap "
             f"{linear['pick']['cap']}** (p95 TPOT {linear['pick']['tpot_p95'] * 1e3:.0f} ms, served "
             f"{100 * linear['pick']['served_share']:.1f} %); {linear['pick']['replicas'] - 1} replicas fail: {fewer}.",
             f"- Llama-3-70B on every catalog GPU at TP 1, 2, 4 and 8 (`{local['command']}`), "
             f"{t['requests']:,} requests over an hour ({t['qps']:.2f} req/s, mean prompt {t['mean_prompt']:.0f}, "
             f"output {t['mean_output']:.0f} tokens):",
             f"    - here, one process: {_size_line(local)};",
             f"    - on a local Ray with {d['cpus']} CPUs, Ray's start included: {_size_line(ray)};",
             f"    - the same pick both ways: {'yes' if d['same_pick'] else 'NO'}."]
    for what, s in (("The next cheaper setting", (local["cheaper_failing"] or [None])[0]),
                    ("The closest cheaper miss", local.get("closest_miss"))):
        if s:
            lines.append(f"- {what}, {s['replicas']} × {s['device']} at cap {s['cap']} (${s['usd_per_hour']:,.2f}/h), "
                         f"misses: {', '.join(s['why'])}.")
    return "\n".join(lines)


def length_grouping(d: dict) -> str:
    source = (f"{d['config']}'s backend ({d.get('backend')}) and the lengths set in the command" if d.get("config")
              else "the default config's lognormal lengths")
    lines = [f"`{d['command']}` ({_load(d)}; {d['duration_s']:g} s of traffic per point, {source}, "
             f"dynamic batching with its cap of {d['dynamic_cap']}; the same trace both ways):", "",
             "| rate | useful decode, plain → grouped | prompt not padding | p50 TTFT | p99 TTFT | p99 E2E | throughput |",
             "|---|---|---|---|---|---|---|"]
    for r in d["rates"]:
        c = r["changes"]
        cell = lambda m: f"{c[m]['rel']:+.0%}" + (" ✓" if c[m]["supported"] else "")  # noqa: E731
        lines.append(f"| {r['rate']:g} req/s | {r['plain']['useful_decode']:.2f} → {r['grouped']['useful_decode']:.2f} | "
                     f"{r['plain']['prompt_fill']:.2f} → {r['grouped']['prompt_fill']:.2f} | {cell('ttft_p50')} | "
                     f"{cell('ttft_p99')} | {cell('e2e_p99')} | {cell('throughput_tok_s')} |")
    sweep = d["skip_sweep"]
    lines += ["", "Changes are grouped against plain, paired request by request (✓: the 95 % interval excludes zero). "
              f"The skip cap at {max(r['rate'] for r in d['rates']):g} req/s:", "",
              "| max_skips | useful decode | throughput (tok/s) | p99 TTFT | longest TTFT |", "|---|---|---|---|---|"]
    for s in sweep:
        name = "plain (no grouping)" if s["max_skips"] is None else str(s["max_skips"])
        lines.append(f"| {name} | {s['useful_decode']:.2f} | {s['throughput_tok_s']:,.0f} | {s['ttft_p99']:.1f} s | "
                     f"{s['ttft_max']:.1f} s |")
    return "\n".join(lines)


def four_modes(d: dict) -> str:
    where = ("the simulator's `toy` step model" if d.get("backend", "sim") == "sim" else
             f"the tiny model on {d['cpus']} CPUs, one torch thread, real time; prompts and KV a quarter of the toy's; "
             f"1-minute load {d['load_1min_before']:.1f} before, {d['load_1min_after']:.1f} after")
    lines = [f"`{d['command']}` ({where}; one trace per workload, seed {d['seed']}):", ""]
    for n, modes in d["workloads"].items():
        lines += [f"{int(n):,} requests:", "",
                  "| mode | output tok/s | mean TTFT | p99 ITL | finished | preemptions |", "|---|---|---|---|---|---|"]
        for name, m in modes.items():
            tok = "—" if m["finished"] == 0 else f"{m['throughput_tok_s']:,.0f}"
            ttft = "—" if m["finished"] == 0 else f"{m['ttft_mean']:.2f} s"
            itl = "—" if m["finished"] == 0 else f"{m['itl_p99'] * 1e3:.1f} ms"
            done = f"{m['finished']:,} of {m['requests']:,}" + (f" ({m['top_error']})" if m["top_error"] else "")
            lines.append(f"| {name} | {tok} | {ttft} | {itl} | {done} | {m['preemptions']:,} |")
        whole, chunked = modes["continuous"], modes["continuous, chunked prefill 512"]
        lines += ["", f"Chunked prefill against whole prompts (both booking KV at admission): p99 ITL "
                  f"{whole['itl_p99'] * 1e3:.1f} → {chunked['itl_p99'] * 1e3:.1f} ms "
                  f"({chunked['itl_p99'] / whole['itl_p99'] - 1:+.0%}), mean TTFT {whole['ttft_mean']:.2f} → "
                  f"{chunked['ttft_mean']:.2f} s ({chunked['ttft_mean'] / whole['ttft_mean'] - 1:+.0%})."
                  + (f" Each request's longest gap, median over requests: {whole['itl_max_p50'] * 1e3:.1f} → "
                     f"{chunked['itl_max_p50'] * 1e3:.1f} ms; the longest of all: {whole['itl_max'] * 1e3:.1f} → "
                     f"{chunked['itl_max'] * 1e3:.1f} ms." if "itl_max" in whole and "itl_max" in chunked else ""), ""]
    return "\n".join(lines).rstrip()


def closed_loop(d: dict) -> str:
    lines = [f"`{d['command']}` ({d['duration_s']:g} s of traffic per level after {d['warmup_s']:g} s of warm-up, "
             f"{d['cpus']} CPUs):", ""]
    for b in d["backends"].values():
        rise = b["rising"]
        lines += [f"{b['backend']} (1-minute load {b['load_1min_before']:.1f} before, {b['load_1min_after']:.1f} after; "
                  f"throughput {'rises' if rise['throughput'] else 'does not rise'} and p95 E2E "
                  f"{'rises' if rise['e2e_p95'] else 'does not rise'} at every level):", "",
                  "| users | output tok/s | req/s | p50 E2E | p95 E2E | p50 TTFT | p50 TPOT | L (mean in system) | most at once |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in b["levels"]:
            lines.append(f"| {r['users']} | {r['throughput_tok_s']:,.0f} | {r['requests_per_s']:.2f} | {r['e2e_p50']:.3f} s | "
                         f"{r['e2e_p95']:.3f} s | {r['ttft_p50'] * 1e3:.1f} ms | {r['tpot_p50'] * 1e3:.1f} ms | "
                         f"{r['little_L']:.2f} | {r['peak_in_system']} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def loadgen(d: dict) -> str:
    """Client CPU per request and the highest rate paced on time, batchlab's client against vLLM's."""
    names = {"lean": "batchlab (lean client)", "httpx": "batchlab through httpx", "vllm": "`vllm bench serve`"}
    lines = [f"`{d['command']}` (stub server streaming one event per token every {d['itl_ms']:g} ms on core 1, every "
             f"client on core 0; {d['prompt_len']}-token prompts; 1-minute load {d['load_avg_1_5_15_before'][0]:.1f} "
             f"before, {d['load_avg_1_5_15_after'][0]:.1f} after, {d['cpus']} CPUs):", ""]
    cpu = {k: v for k, v in d["lengths"].items() if "cpu" in v}
    if cpu:
        lines += ["| stream | client | CPU per request | CPU per chunk | send lag p99 | runs |", "|---|---|---|---|---|---|"]
        for length, v in cpu.items():
            c = v["cpu"]
            for client, m in c["median"].items():
                lines.append(f"| {length} tokens at {c['rate']:g} req/s | {names.get(client, client)} | "
                             f"{m['cpu_per_request_ms']:.2f} ms | {m['cpu_per_chunk_us']:.1f} µs | "
                             f"{m['send_lag_p99'] * 1e3:.2f} ms | {len(c['runs'][client])} |")
        lines += ["", "Medians over the runs, each client in rotating order on the same trace. batchlab's client CPU per "
                  "request over vLLM's client's (`cpu_per_request_ratio_vs_vllm`): " + "; ".join(
                      f"{length} tokens **{v['cpu_per_request_ratio_vs_vllm']:.2f}×**"
                      + (f" (through httpx {v['httpx_cpu_per_request_ratio_vs_vllm']:.2f}×)"
                         if "httpx_cpu_per_request_ratio_vs_vllm" in v else "")
                      for length, v in cpu.items() if "cpu_per_request_ratio_vs_vllm" in v) + ".", ""]
        parse = {k: v["lean_parse_us_per_event"] for k, v in cpu.items() if "lean_parse_us_per_event" in v}
        if parse and "32" in cpu:
            whole = cpu["32"]["cpu"]["median"]["lean"]["cpu_per_chunk_us"]
            lines += [f"Where the lean client's CPU per chunk goes: its own work on an event (httptools, the SSE split, "
                      f"orjson, the stamp; the read callback fed stub events in a loop, best of 3) takes "
                      f"**{min(parse.values()):.1f} µs**, of {whole:.1f} µs per chunk in all at 32 tokens; the rest is the "
                      "event loop's and the kernel's per-read cost, and per request the connection, the request's "
                      "own objects and its wake-up.", ""]
    return "\n".join(lines + _loadgen_ladder(d, names)).rstrip()


def _loadgen_ladder(d: dict, names: dict[str, str]) -> list[str]:
    """The ladder of rates: what each client held under the two send-lag rules."""
    lines: list[str] = []
    ladder = {k: v for k, v in d["lengths"].items() if "ladder" in v}
    if ladder:
        loose = d.get("loose_rule_s", d["lag_rule_s"])
        lines += [f"Highest rate held: every request finished and send lag p99 ≤ {d['lag_rule_s'] * 1e3:g} ms (and, "
                  f"beside it, ≤ {loose * 1e3:g} ms). Each rung is a new seeded trace; a client's ladder stops at "
                  f"its first rung over {loose * 1e3:g} ms:", "",
                  f"| stream | client | held at ≤ {d['lag_rule_s'] * 1e3:g} ms | held at ≤ {loose * 1e3:g} ms | "
                  "send lag p99 at each rung | CPU per request at the top rung held | stub's core share there |",
                  "|---|---|---|---|---|---|---|"]
        for length, v in ladder.items():
            for client, lad in v["ladder"].items():
                rows = lad["rows"]
                top = next((r for r in reversed(rows) if r.get("held_loose", r["held"])), None)
                lags = ", ".join(f"{r['rate']:g}: " + ("?" if r["send_lag_p99"] is None else f"{r['send_lag_p99'] * 1e3:.2f}")
                                 + (f" ({r['failed']} failed)" if r["failed"] else "") for r in rows)
                held = lambda x: f"{x:g} req/s" if x else "none"  # noqa: E731
                cpu_r = "—" if top is None or top["cpu_per_request_ms"] is None else f"{top['cpu_per_request_ms']:.2f} ms"
                share = "—" if top is None else f"{top['stub_core_share']:.2f}"
                name = names.get(client, client.replace("lean x", "batchlab, processes: "))
                lines.append(f"| {length} tokens | {name} | {held(lad['held'])} | {held(lad.get('held_loose'))} | "
                             f"{lags} ms | {cpu_r} | {share} |")
        for length, v in ladder.items():
            one, split = v["ladder"].get("lean"), next((x for k, x in v["ladder"].items() if k.startswith("lean x")), None)
            if one and split:
                a = {r["rate"]: r["cpu_per_request_ms"] for r in one["rows"] if r["finished"] == r["requests"]}
                b = {r["rate"]: r["cpu_per_request_ms"] for r in split["rows"] if r["finished"] == r["requests"]}
                both = sorted(set(a) & set(b))
                if both:
                    ratio = statistics.median(b[x] / a[x] for x in both)
                    lines.append(f"\n{length} tokens: CPU per request of the processes together over one process's, "
                                 f"median over the {len(both)} rungs both completed: {ratio:.2f}×.")
    return lines


def plan_cpu(d: dict) -> str:
    """The plan's experiment: verdict, sentence, hypotheses, a row per strategy and rate, two plots."""
    t, su = d["config"]["traffic"], d["setup"]
    vllm = (su.get("baselines") or {}).get("vllm", {})
    lines = [f"`{d['run']}`, then `{d['command']}` ({su['model']} model, {su['params']:,} parameters, {su['device']}, "
             f"{su['dtype']}, torch {su['torch']}; vLLM: {vllm.get('version', 'not run')}, flags "
             f"{vllm.get('flags') or 'its defaults'}; {(su.get('baselines') or {}).get('cores', '')}; {su['machine']}; "
             f"{d['repeats']} repeats of {t['duration_s']:g} s of Poisson traffic after {t['warmup_s']:g} s of warm-up "
             f"at each rate):", "", f"**{d['verdict']}**", ""]
    if d["sentence"]:
        lines += [f"> {d['sentence']}", ""]
    lines += ["| hypothesis | answer | figures |", "|---|---|---|"]
    lines += [f"| {h['hypothesis']} | **{h['answer']}** | {h['figures']} |" for h in d["hypotheses"]]
    lines += ["", "Medians over repeats:", "",
              "| rate | strategy | output tok/s | p50 TTFT | p99 TTFT | p50 TPOT | p99 E2E | SLO met | failed |",
              "|---|---|---|---|---|---|---|---|---|"]
    ms = lambda x: f"{x * 1e3:,.0f} ms" if x < 1 else f"{x:,.2f} s"   # noqa: E731
    for p in sorted(d["points"], key=lambda p: p["rate"]):
        lines.append(f"| {p['rate']:g} req/s | {p['strategy']} | {p['throughput_tok_s']:,.0f} | {ms(p['ttft_p50'])} | "
                     f"{ms(p['ttft_p99'])} | {p['tpot_p50'] * 1e3:.1f} ms | {ms(p['e2e_p99'])} | "
                     f"{p['slo_attainment']:.0%} | {p['failed']:.0f} |")
    lines += [""] + [f"![{Path(p).stem}]({p})" for p in d["plots"]]
    return "\n".join(lines).rstrip()


def torch_thread_ab(d: dict) -> str:
    lines = [f"`{d['command']}` (tiny model, CPU, fp32, {d['threads']} torch thread(s); {_load(d)}; each sample a fresh "
             "process, the median of its passes; medians over samples, the paired ratio's min–max beside it):", "",
             "| decode rows | all torch work on one thread | set up on one, passes on another | split / one |",
             "|---|---|---|---|"]
    for lv in d["levels"]:
        r = lv["split_over_one_per_repeat"]
        lines.append(f"| {lv['concurrency']} | {lv['pass_ms']['one']:.2f} ms | {lv['pass_ms']['split']:.2f} ms | "
                     f"{lv['split_over_one']:.2f}× ({min(r):.2f}–{max(r):.2f}) |")
    return "\n".join(lines)


def busy_threads(d: dict) -> str:
    lines = [f"`{d['command']}` (tiny model, CPU, fp32, batch 1, 32-token prompt, 64 new tokens; {_load(d)}; each "
             f"sample a fresh process; busy: a job burning {100 * d['duty']:.0f} % of every core; medians over samples, "
             "the paired ratio's min–max beside it):", "",
             "| machine | 1 torch thread | 2 torch threads | two / one |", "|---|---|---|---|"]
    for cond, c in d["conditions"].items():
        r = c["two_over_one_per_repeat"]
        lines.append(f"| {cond} | {c['tok_s']['1']:,.0f} tok/s | {c['tok_s']['2']:,.0f} tok/s | "
                     f"{c['two_over_one']:.2f}× ({min(r):.2f}–{max(r):.2f}) |")
    return "\n".join(lines)


def drift_baseline(d: dict) -> str:
    """Each profile's one timing of the drift probe's burst beside the fit's replay of it, and each
    kept validation's timings against both."""
    b = d["burst"]
    conds = sorted({c for p in d["profiles"].values() for c in p["validations"]}, key=lambda c: (c != "quiet", c))

    def spread(per: dict, key: str) -> str:
        vals = [w[key] for w in per.values()]
        return f"{min(vals):.2f}–{max(vals):.2f}×"
    lines = [f"`{d['command']}` (the burst: {b['rows']} requests of {b['prompt']} prompt and {b['new']} new tokens; "
             "each validation's range is over its workloads, each a median of its timings before, between and after "
             "its runs):", "",
             "| profile | fit's rms error | timed at the profile | the fit's replay | timed over replay | "
             + " | ".join(f"{c}: over the timing | {c}: over the replay" for c in conds) + " |",
             "|---|---|---|---|---|" + "---|---|" * len(conds)]
    for name, p in d["profiles"].items():
        cells = [f"{spread(p['validations'][c], 'over_profile')} | {spread(p['validations'][c], 'over_prediction')}"
                 if c in p["validations"] else "– | –" for c in conds]
        lines.append(f"| {name} | {_pct(p['fit_rms'])} | {1e3 * p['timed_s']:.0f} ms | {1e3 * p['predicted_s']:.0f} ms | "
                     f"{p['timed_over_predicted']:.2f}× | " + " | ".join(cells) + " |")
    return "\n".join(lines)


RENDER = {"sim_speed": sim_speed, "hf_dynamic_vs_naive": hf_dynamic_vs_naive, "engine_vs_hf_cb": engine_vs_hf_cb,
          "validate_sim": validate_sim, "serving": serving, "client_vs_vllm_bench": client_vs_vllm_bench,
          "prefix_cache": prefix_cache, "policies": policies, "ray_sweep": ray_sweep,
          "roofline_check": roofline_check, "size_search": size_search, "length_grouping": length_grouping,
          "four_modes": four_modes, "closed_loop": closed_loop, "loadgen": loadgen,
          "plan_cpu": plan_cpu, "same_point": same_point, "corrections": corrections,
          "twin_contention_vllm": twin_contention, "twin_contention_batchlab": twin_contention,
          "twin_vllm_probe": twin_probe, "twin_batchlab_probe": twin_probe, "twin_vllm_clump": twin_probe, "twin_vllm_stay": twin_probe,
          "twin_vllm_long": twin_probe, "twin_vllm_rows": twin_rows,
          "twin_vllm_alternate": twin_alternate, "twin_vllm_alternate_host": twin_alternate,
          "beside_rows_vllm": beside_rows, "twin_vllm_per_request": per_request, "twin_vllm_per_request_s71": per_request,
          "twin_vllm_per_request_s81": per_request, "twin_vllm_alternate_warm": twin_alternate,
          "twin_vllm_whatif_warm": twin_whatif,
          "torch_thread_ab": torch_thread_ab,
          "busy_threads": busy_threads, "drift_baseline": drift_baseline}
# Result files written by a benchmark with other settings (serving-max-num-seqs-128.json, ...) use its renderer.
FAMILIES = {"serving-": serving, "twin_vllm_per_request_": per_request,  # before "twin_": the first prefix wins
            "twin_vllm_whatif_": twin_whatif,
            "engine_vs_hf_cb_": engine_vs_hf_cb, "validate_sim_": validate_sim, "twin_": twin, "four_modes_": four_modes,
            "length_grouping_": length_grouping, "corrections_": corrections, "refits_": refits,
            "intervals_": intervals, "drift_baseline_": drift_baseline}
BLOCK = re.compile(r"(<!-- figures:([\w.-]+) -->\n)(.*?)(<!-- /figures:\2 -->)", re.S)


def renderer(name: str):
    """The function that renders result file NAME.json, or None."""
    return RENDER.get(name) or next((fn for prefix, fn in FAMILIES.items() if name.startswith(prefix)), None)


def blocks(text: str) -> list[str]:
    """The names of the figures blocks in a page, in order."""
    return [m.group(2) for m in BLOCK.finditer(text)]


def render(text: str, results: Path) -> str:
    """The page with every figures block whose result file exists regenerated from it."""
    def block(m: re.Match) -> str:
        path, fn = results / f"{m.group(2)}.json", renderer(m.group(2))
        if fn is None or not path.is_file():
            return m.group(0)
        return m.group(1) + fn(json.loads(path.read_text())) + "\n" + m.group(4)
    return BLOCK.sub(block, text)


def problems(text: str, results: Path) -> list[str]:
    """Blocks that cannot be rendered: no renderer for the name, or no result file behind it."""
    out = []
    for name in blocks(text):
        if renderer(name) is None:
            out.append(f"figures:{name}: no renderer in benchmarks/readme_figures.py")
        elif not (results / f"{name}.json").is_file():
            out.append(f"figures:{name}: no result file {results / name}.json")
    return out


def pages(root: Path) -> list[Path]:
    """Every page that may hold figures: the README and the docs."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="Exit 1 if a page disagrees with the result files.")
    ap.add_argument("--results", default="docs/results")
    ap.add_argument("files", nargs="*", type=Path, help="Pages to render (default: README.md and docs/**/*.md).")
    args = ap.parse_args()
    results = Path(args.results)
    bad = 0
    for path in args.files or pages(Path(".")):
        old = path.read_text()
        if not blocks(old):
            continue
        issues = problems(old, results)
        for issue in issues:
            print(f"{path}: {issue}")
        new = render(old, results)
        if args.check:
            if new != old:
                print(f"{path}: figures differ from {results}; run python benchmarks/readme_figures.py")
            bad += bool(issues) or new != old
            continue
        bad += bool(issues)
        if new != old:
            path.write_text(new)
        print(f"{path}: {'updated' if new != old else 'already up to date'}")
    if args.check and not bad:
        print(f"every figures block matches {results}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
