"""Every figure the README and the docs quote from a benchmark is rendered from a committed result
file (docs/results/*.json) by benchmarks/readme_figures.py: every page must agree with those files."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pages_with_blocks(mod) -> dict[Path, str]:
    return {p: p.read_text() for p in mod.pages(ROOT) if mod.blocks(p.read_text())}


def test_every_page_quotes_exactly_what_the_result_files_hold():
    mod = figures()
    pages = pages_with_blocks(mod)
    names = {name for text in pages.values() for name in mod.blocks(text)}
    assert names >= set(mod.RENDER), f"result files rendered nowhere: {set(mod.RENDER) - names}"
    for path, text in pages.items():
        assert not mod.problems(text, ROOT / "docs" / "results"), path
        assert mod.render(text, ROOT / "docs" / "results") == text, \
            f"{path.relative_to(ROOT)}: figures differ from docs/results: run python benchmarks/readme_figures.py"


def test_the_check_command_passes_here_and_fails_on_an_unknown_block(tmp_path):
    script = ROOT / "benchmarks" / "readme_figures.py"
    ok = subprocess.run([sys.executable, str(script), "--check"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    page = tmp_path / "page.md"
    page.write_text("<!-- figures:no_such_benchmark -->\n<!-- /figures:no_such_benchmark -->\n")
    bad = subprocess.run([sys.executable, str(script), "--check", "--results", str(ROOT / "docs" / "results"), str(page)],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "no renderer" in bad.stdout


def test_a_changed_result_file_changes_the_page(tmp_path):
    """The check can fail: one repeat of a committed file edited, and its block no longer matches."""
    mod = figures()
    name = "policies"
    text = next(t for t in pages_with_blocks(mod).values() if name in mod.blocks(t))
    for f in (ROOT / "docs" / "results").glob("*.json"):
        (tmp_path / f.name).write_text(f.read_text())
    data = json.loads((tmp_path / f"{name}.json").read_text())
    data["load_avg_1_5_15"]["before"][0] += 10.0
    (tmp_path / f"{name}.json").write_text(json.dumps(data))
    assert mod.render(text, tmp_path) != text


def test_a_supporting_run_uses_its_familys_renderer():
    mod = figures()
    assert mod.renderer("serving-max-num-seqs-128") is mod.serving and mod.renderer("nothing-here") is None


def _serving_result(vllm_rates: list[float | None], ours_tok_s: float = 1800.0) -> dict:
    """A result file as benchmarks/serving.py writes it: per server, one search per repeat."""
    def repeat(rate, i, tok_s):
        failed = None if rate is None else rate * 1.08
        points = [{"rate": rate, "throughput_tok_s": 10 * rate, "ttft_p99": 0.1, "tpot_p99": 0.02,
                   "served_share": 1.0, "window_tok_s": 10 * rate, "sustained": True, "why": []}] if rate else []
        points += [{"rate": failed or 8.0, "throughput_tok_s": 500.0, "ttft_p99": 3.0, "tpot_p99": 0.02,
                    "served_share": 0.9, "window_tok_s": 450.0, "sustained": False, "why": ["served 90.0 %"]}]
        return {"sustained_rate": rate, "failed_rate": failed or 8.0, "probes": [p["rate"] for p in points],
                "settled": rate is not None, "points": points, "repeat": i, "position": i % 2,
                "saturated": {"tok_s": tok_s, "req_s": tok_s / 32, "failed": 0, "requests": 1024},
                "memory": {}, "load_1min_before": 0.5}

    def server(name, rates, tok_s):
        return {"server": name, "repeats": [repeat(r, i, tok_s) for i, r in enumerate(rates)]}
    return {"command": "python benchmarks/serving.py", "cpus": 2, "pinned": True,
            "load_avg_1_5_15": {"before": [0.5], "after": [0.7]},
            "trace": {"arrival": "poisson", "duration_s": 30, "warmup_s": 2, "prompt_len": 32, "output_len": 32},
            "slo": {"ttft_s": 2.0}, "rule": {"served": 0.95, "growth_s_per_s": 0.1, "tolerance": 0.1,
                                              "bracket_start": [40, 80], "max_points": 10, "burst": 1024},
            "sustain_repeats": 2, "order": [["continuous", "vllm"], ["vllm", "continuous"]],
            "servers": [server("batchlab serve continuous", [50.0, 50.0], ours_tok_s),
                        server("batchlab serve naive", [None, None], 900.0),
                        server("vllm", vllm_rates, 2000.0)]}


def test_the_serving_block_gives_per_repeat_values_ratios_and_targets():
    mod = figures()
    agree = mod.serving(_serving_result([40.0, 45.0]))
    assert "| batchlab serve naive | none (none, none) |" in agree
    assert "| batchlab serve continuous | 50 (50, 50) | 54 (54, 54) | 2 / 2 |" in agree
    assert "sustained rate: **1.18×** (median of per-repeat ratios 1.25 / 1.11" in agree
    assert "Target ≥ 1.0×: **met**." in agree and "disagree" not in agree
    assert "saturated throughput: **0.90×** (median of per-repeat ratios 0.90 / 0.90). Target ≥ 1.0×: **not met**" in agree
    assert "50 ✓ · 54 ✗ (served 90.0 %)" in agree
    split = mod.serving(_serving_result([60.0, 45.0]))
    assert "the repeats disagree on which is higher" in split    # 50/60 < 1 < 50/45


def test_a_server_that_could_not_run_is_a_row_that_says_so():
    d = _serving_result([40.0, 45.0])
    d["servers"].append({"server": "transformers", "repeats": [{"error": "did not come up", "load_1min_before": 0.1}]})
    assert "| transformers | could not run: did not come up |" in figures().serving(d)


def test_a_burst_only_run_says_nothing_was_searched():
    d = _serving_result([40.0, 45.0])
    d["rule"]["max_points"] = 0
    for srv in d["servers"]:
        for r in srv["repeats"]:
            r.update(sustained_rate=None, failed_rate=None, probes=[], points=[], settled=False)
    out = figures().serving(d)
    assert "| vllm | not searched |" in out and "saturated throughput: **0.90×**" in out
    assert "sustained rate:" not in out and "repeat 1 (" not in out


def test_the_corrections_block_gives_the_intervals_coverage_now_and_under_an_earlier_rule():
    mod = figures()
    on = {"drift": True, "live": True, "first_token": True}
    metrics = {m: {"error_median": 0.1, "below": 0.5, "above": 0.5, "cells": 4} for m in ("e2e_p50", "ttft_p50", "tpot_p50")}
    variant = {"on": on, "label": "all", "coverage": 0.9, "metrics": metrics}
    cond = {"dir": "d", "cells": 4, "interval": "rule B", "floor": {m: 0.1 for m in metrics}, "variants": [variant]}
    d = {"command": "c", "one_sided_above": 0.75, "conditions": {"a": cond, "b": cond | {"variants": [variant | {"coverage": 1.0}]}},
         "summary": [{"label": "all", "balanced": 2, "of": 2, "mean_error": 0.1}],
         "earlier_intervals": [{"interval": "rule A", "command": "old", "coverage": {"a": 0.97}}]}
    text = mod.corrections(d)
    assert "held `a` 90.0 %, `b` 100.0 %; built as rule B." in text
    assert "built as rule A (`old`): held `a` 97.0 %, `b` –." in text


def _two_variants(tunings: list[dict], coverage: list[float]) -> dict:
    """A corrections record of one validation `a`: every correction on, once per tuning."""
    metrics = {m: {"error_median": 0.1, "below": 0.5, "above": 0.5, "cells": 4} for m in ("e2e_p50", "ttft_p50", "tpot_p50")}
    on = {"drift": True, "live": True, "first_token": "delay"}
    variants = [{"on": on | t, "label": f"v{i}", "coverage": c, "metrics": metrics}
                for i, (t, c) in enumerate(zip(tunings, coverage))]
    cond = {"dir": "d", "cells": 4, "interval": "rule B", "floor": {m: 0.1 for m in metrics}, "variants": variants}
    return {"command": "c", "one_sided_above": 0.75, "conditions": {"a": cond},
            "summary": [{"label": v["label"], "balanced": 1, "of": 1, "mean_error": 0.1} for v in variants]}


def test_the_corrections_block_gives_each_gates_coverage_on_its_own_line():
    text = figures().corrections(_two_variants([{"gate": 0.0}, {"gate": 2.0}], [0.88, 0.92]))
    assert "with the three corrections (target 85–95 %) held `a` 88.0 %" in text
    assert "with the three corrections (gate 2) (target 85–95 %) held `a` 92.0 %" in text


def test_the_corrections_block_gives_each_count_of_the_standard_errors_its_own_line():
    tunings = [{"gate": 2.0, "se_units": "cells"}, {"gate": 2.0, "se_units": "workloads"}]
    text = figures().corrections(_two_variants(tunings, [0.80, 0.86]))
    assert "(gate 2, standard errors over cells) (target 85–95 %) held `a` 80.0 %" in text
    assert "(gate 2, standard errors over workloads) (target 85–95 %) held `a` 86.0 %" in text


def test_the_corrections_block_sums_the_held_out_validations_apart_and_with_the_others():
    d = _two_variants([{"gate": 2.0}], [0.9])
    d["conditions"]["b"] = d["conditions"]["a"]
    d["held_out"] = ["b"]
    d["summary_held_out"] = [{"label": "v0", "balanced": 0, "of": 1, "mean_error": 0.2}]
    d["summary_all"] = [{"label": "v0", "balanced": 1, "of": 2, "mean_error": 0.15}]
    lines = figures().corrections(d).splitlines()
    assert lines[2].endswith("| held out: no metric one-sided | held out: mean error | all: no metric one-sided | all: mean error |")
    assert lines[3].count("|") == lines[2].count("|") == lines[4].count("|")
    assert lines[5].endswith("| 1 of 1 | 10.0 % | 0 of 1 | 20.0 % | 1 of 2 | 15.0 % |")


def test_the_corrections_block_puts_each_validations_live_profile_with_and_without_the_drift_probe_side_by_side():
    d = _two_variants([{"gate": 2.0}, {"gate": 2.0, "drift": False}], [0.9, 0.9])
    for v, label, scale in zip(d["conditions"]["a"]["variants"], ("drift probe + live factor + first-token delay",
                                                                  "live factor + first-token delay"), (1.47, 1.49)):
        v.update(label=f"{label} (gate 2)", live_profile={"server": scale})
    d["summary"] = [{"label": v["label"], "balanced": 1, "of": 1, "mean_error": 0.1} for v in d["conditions"]["a"]["variants"]]
    text = figures().corrections(d)
    assert text.endswith("live factor + first-token delay: `a` 1.47× / 1.49×.")
    del d["conditions"]["a"]["variants"][1]["live_profile"]          # a record made before it was kept: no line
    assert "live profile" not in figures().corrections(d)


def test_a_correction_the_gate_left_out_says_so():
    mod = figures()
    rec = {"per_workload": {"base": {"server": {"factor": 1.01, "se": 0.02, "cells": 8, "applied": False}},
                            "long": {"server": {"factor": 1.2, "se": 0.02, "cells": 8}}},
           "pooled": {"server": {"factor": 1.05, "se": 0.02, "cells": 16}}}
    line = mod._live(rec)[1]
    assert "`base` 1.01× (server, ± 2 %, not applied); `long` 1.20× (server, ± 2 %)" in line


def test_a_drift_factor_the_replays_were_not_scaled_by_says_so():
    drift = {"base": {"server": {"factor": 1.29, "applied": False}}, "long": {"server": {"factor": 1.61, "applied": True}},
             "old": {"server": {"factor": 1.1}}}
    assert figures()._drifts(drift) == "`base` 1.29× (not applied), `long` 1.61×, `old` 1.10×"


def test_a_drift_factor_against_the_profiles_timing_gives_the_one_against_the_fits_replay_beside():
    drift = {"base": {"server": {"factor": 0.74, "vs_prediction": 0.97, "applied": False}},
             "long": {"server": {"factor": 1.30, "vs_prediction": 1.02, "applied": True}}}
    assert figures()._drifts(drift) == ("`base` 0.74× (0.97× against the fit's replay, not applied), "
                                        "`long` 1.30× (1.02× against the fit's replay)")


def _burst(tok_s: float, tpot_s: float, **more) -> dict:
    return {"requests": 8, "tok_s": tok_s, "req_s": tok_s / 10, "tpot_p50": tpot_s, "ttft_p50": 0.1, "failed": 0} | more


def test_a_paired_what_if_reads_the_change_pair_by_pair_and_what_the_waiting_server_took():
    mod = figures()
    # the machine's speed moves between pairs; the caps' medians alone would read +30 % and +20 %
    control = [_burst(1000, 0.020, wall_s=10, beside_cpu_s=0.1), _burst(500, 0.040, wall_s=20, beside_cpu_s=0.6),
               _burst(800, 0.025, wall_s=10, beside_cpu_s=0.2)]
    other = [_burst(1200, 0.030, wall_s=10, beside_cpu_s=0.2), _burst(600, 0.060, wall_s=20, beside_cpu_s=0.4),
             _burst(1040, 0.030, wall_s=10, beside_cpu_s=0.3)]
    w = {"burst": {"requests": 8, "prompt": 64, "output": 32}, "pairs": 3, "command": "twin.py --whatif-pairs 3",
         "caps": [{"cap": 32, "measured": control, "predicted": _burst(800, 0.025)},
                  {"cap": 128, "measured": other, "control": control, "predicted": _burst(880, 0.035)}]}
    text = "\n".join(mod._twin_whatif(w))
    assert "beside a second at cap 32, 3 pairs of bursts alternating" in text
    assert "cap 128 throughput +20.0 % measured (pairs +20.0 % to +30.0 %), +10.0 % twin" in text
    assert "the twin's change 0.50× the server's" in text
    assert "cap 128 p50 TPOT +50.0 % measured (pairs +20.0 % to +50.0 %), +40.0 % twin" in text
    assert "took 2.0 % of a core (median over 6 bursts; 1.0 to 3.0 %)" in text


def test_a_what_if_on_servers_one_after_another_compares_the_caps_medians():
    mod = figures()
    w = {"burst": {"requests": 8, "prompt": 64, "output": 32}, "command": "twin.py",
         "caps": [{"cap": 32, "measured": [_burst(1000, 0.02), _burst(900, 0.02)], "predicted": _burst(800, 0.025)},
                  {"cap": 8, "measured": [_burst(570, 0.01), _burst(380, 0.01)], "predicted": _burst(400, 0.0125)}]}
    text = "\n".join(mod._twin_whatif(w))
    assert "restarted at each sequence cap, twice" in text and "pairs" not in text and "of a core" not in text
    assert "cap 8 throughput -50.0 % measured, -50.0 % twin (same direction; the twin's change 1.00× the server's)" in text


def test_a_what_if_with_engine_steps_counted_sets_the_servers_beside_the_twins():
    mod = figures()
    vllm = {"32": 30.0, "128": 2.0, "2048": 1.0, "inf": 0.0}
    w = {"burst": {"requests": 8, "prompt": 64, "output": 32}, "command": "twin.py",
         "caps": [{"cap": 32, "measured": [_burst(1000, 0.02, steps=100, step_sizes=vllm, gap_p50=0.010),
                                           _burst(900, 0.02, steps=104, step_sizes=vllm, gap_p50=0.012),
                                           _burst(950, 0.02, steps=98, step_sizes=vllm, gap_p50=0.011)],
                   "predicted": _burst(800, 0.025, steps=96, step_sizes={"32": 95, "2080": 1}, gap_p50=0.010)},
                  {"cap": 8, "measured": [_burst(570, 0.01, steps=400, step_sizes={"8": 390, "512": 10}, gap_p50=0.0066)],
                   "predicted": _burst(400, 0.0125, steps=384, step_sizes={"8": 380, "520": 4}, gap_p50=0.006)}]}
    text = "\n".join(mod._twin_whatif(w))
    assert ("Engine steps per burst, vLLM's own count (its /metrics) against the twin's: cap 32 100 (98–104 "
            "over 3) against 96 (0.96×); cap 8 400 (400–400 over 1) against 384 (0.96×).") in text
    assert "(prompts beside the decoding rows): cap 32 3 (3–3 over 3) against 1; cap 8 10 (10–10 over 1) against 4." in text
    assert "cap 32 11.0 (10.0–12.0 over 3) ms against 10.0 ms; cap 8 6.6 (6.6–6.6 over 1) ms" in text
    assert "cap 8's change -40.0 % measured, -40.0 % twin." in text
    for r in w["caps"][1]["measured"]:              # a cap not counted in every burst: no counts at all
        del r["steps"], r["step_sizes"], r["gap_p50"]
    text = "\n".join(mod._twin_whatif(w))
    assert "Engine steps per burst" in text and "cap 8 400" not in text and "Median gap" not in text


def test_bursts_of_several_sizes_set_the_twin_beside_the_server_size_by_size():
    mod = figures()
    s = {"burst": {"prompt": 64, "output": 32}, "batch_sizes_profiled": [1, 8, 32], "command": "twin.py --parts sizes",
         "load_1min_after": 1.2,
         "sizes": [{"requests": 32, "measured": [_burst(0, 0.03, span_tok_s=800, gap_p50=0.028),
                                                 _burst(0, 0.03, span_tok_s=900, gap_p50=0.026)],
                    "predicted": _burst(0, 0.03, span_tok_s=850, gap_p50=0.027)},
                   {"requests": 192, "measured": [_burst(0, 0.4, span_tok_s=360, gap_p50=0.361)],
                    "predicted": _burst(0, 0.2, span_tok_s=1080, gap_p50=0.150)}]}
    text = "\n".join(mod._twin_sizes(s, "transformers"))
    assert "on transformers serve and on its twin (`twin.py --parts sizes`; 64 + 32 tokens" in text
    assert "decode bursts of 1, 8, 32 requests" in text
    assert "| 32 | 800, 900 | 850 | 1.00× | 28.0, 26.0 ms | 27.0 ms |" in text     # against the runs' median
    assert "| 192 | 360 | 1,080 | 3.00× | 361.0 ms | 150.0 ms |" in text


def test_past_the_knee_the_served_rate_is_set_beside_the_knees():
    mod = figures()
    d = _serving_result([40.0, 45.0])
    for rep in d["servers"][0]["repeats"]:
        rep["overload"] = {"rate": 75.0, "factor": 1.5, "served_share": 0.6, "ttft_p50": 3.0, "tpot_p99": 0.05,
                           "send_lag_p99": 0.001, "window_tok_s": 450.0 if rep["repeat"] == 0 else 550.0}
    text = mod.serving(d)                                   # the knee served 10 x 50 = 500 tok/s in each repeat
    assert "Served tok/s there over served tok/s at the knee: 1.00× (0.90, 1.10)." in text


def test_a_twin_validation_shows_its_signed_error_by_workload():
    mod = figures()
    by = {"base": {"e2e_p50": {"median_error": -0.12, "cells": 3}, "ttft_p50": {"median_error": 0.02, "cells": 3},
                   "tpot_p50": {"median_error": -0.1, "cells": 3}},
          "long-outputs": {"e2e_p50": {"median_error": 0.054, "cells": 3}}}
    line = mod._by_workload(by)[-1]
    assert "`base` -12.0 % / +2.0 % / -10.0 %; `long-outputs` +5.4 % / – / –." in line
    assert mod._by_workload(None) == [] and mod._by_workload({}) == []


def test_the_profile_line_says_how_the_server_and_the_twin_split_a_burst_and_what_the_twin_took():
    mod = figures()
    probe = {"requests": 32, "prompt": 64, "output": 2, "rounds": 2}
    ho = {"engine_s": 0.00065, "priced_s": 0.0, "probe": probe,
          "server": [{"8": 30.0, "128": 1.0, "1024": 1.0, "2048": 1.0}, {"8": 30.0, "128": 1.0, "1024": 2.0}],
          "twin_priced": {"4096": 1.0}, "twin": {"128": 1.0, "1024": 1.0, "2048": 1.0}}
    text = mod._handed(ho)
    assert "the server computed the prompts in 3 steps (≤128, ≤1024, ≤2048); 3 steps (≤128, ≤1024 ×2)" in text
    assert "the twin at that price in 1 step (≤4096); the fit found 0.65 ms, splitting it in 3 steps" in text
    assert "not taken (the twin keeps the price; --hand-over-fit takes it)" in text
    taken = mod._handed(ho | {"probe": probe | {"fit": True}})
    assert "; the twin takes 0.65 ms, splitting it in 3 steps (≤128, ≤1024, ≤2048)" in taken
    assert "the fit keeps that price" in mod._handed(ho | {"engine_s": 0.0}) and mod._handed(None) == ""
