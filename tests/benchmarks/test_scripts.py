"""Every name a benchmark script imports from the package exists (read from its source, not by
running it), the serving script starts, and bad input to the scripts with checked flags is one error
line, exit status 2, nothing written. What the scripts compute is tested on the package modules
they call; scripts only ever run here as subprocesses."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def package_imports(script: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every `import batchlab...` and `from batchlab... import name` in a script."""
    out = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("batchlab"):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("batchlab")]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_what_each_script_imports_from_the_package_exists(script):
    if any(m.startswith(("batchlab.backends.hf", "batchlab.baselines.decode_step")) for m, _ in package_imports(script)):
        pytest.importorskip("transformers")
    for module, name in package_imports(script):
        mod = importlib.import_module(module)
        assert name is None or hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), f"{module}.{name}"


def test_the_serving_script_answers_help():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.startswith("usage:") and "--max-points" in res.stdout, res.stderr


@pytest.mark.parametrize("script, args, says", [
    ("serving.py", ["--duration", "0"], "traffic.duration_s"),
    ("serving.py", ["--bracket", "fast"], "--bracket: want LO,HI"),
    ("client_vs_vllm_bench.py", ["--venv", "/nonexistent"], "no vLLM environment"),
    ("policies.py", ["--only-hf"], "--only-hf needs --json"),
    ("twin.py", ["--parts", "profile,nap"], "--parts: unknown nap"),
    ("twin.py", ["--bracket", "fast"], "--bracket: want LO,HI"),
    ("twin.py", ["--parts", "alternate", "--alternate-with", "spiky", "--out", "/nonexistent/twin"],
     "--alternate-with spiky: not one of the config's held-out workloads"),
    ("twin.py", ["--parts", "alternate", "--alternate-pairs", "0", "--out", "/nonexistent/twin"], "--alternate-pairs: want at least 1"),
    ("twin.py", ["--warm-bursts", "-1", "--out", "/nonexistent/twin"], "--warm-bursts: want 0 or more"),
    ("twin.py", ["--parts", "contention", "--condition", "busy"], "run it with --condition quiet"),
    ("twin.py", ["--predict-only", "--out", "/nonexistent/twin"], "no twin at /nonexistent/twin/twin.yaml"),
    ("twin.py", ["--parts", "validate", "--condition", "busy", "--out", "/nonexistent/twin"],
     "--parts validate: no twin at /nonexistent/twin/twin.yaml"),
    ("corrections.py", ["old=/nonexistent/validate"], "old: /nonexistent/validate is not a finished validation"),
    ("corrections.py", ["old=/nonexistent/validate", "--gates", "0,two"], "--gates: expected numbers separated by commas"),
    ("corrections.py", ["old=/nonexistent/validate", "--gates", "-1"], "--gates: each gate is between 0 and 10"),
    ("corrections.py", ["old=/nonexistent/validate", "--se-units", "cells,runs"], "--se-units: expected cells or workloads"),
    ("corrections.py", ["old=/nonexistent/validate", "--set", "validation.drift=apply"],
     "--set validation.drift: set by the combinations themselves"),
    ("corrections.py", ["old=/nonexistent/validate", "--set", "drift_against"], "--set: expected KEY=VALUE"),
    ("per_request.py", ["/nonexistent/validate", "--twin", "t.yaml"], "/nonexistent/validate: not a kept validation"),
    ("beside_rows.py", ["/nonexistent/profile.json"], "not a measured profile"),
    ("refits.py", ["/nonexistent", "--rows", "32"], "want a profile's directory"),
    ("refits.py", [str(ROOT), "--without", "magic"], "--without: unknown term magic"),
    ("refits.py", ["/nonexistent", "--past-rows"], "--past-rows goes with --rows N"),
    ("twin.py", ["--batch-sizes", "1,two"], "--batch-sizes: want whole numbers"),
    ("twin.py", ["--whatif-burst", "384,64"], "--whatif-burst: want N,PROMPT,OUTPUT"),
    ("twin.py", ["--whatif-runs", "0"], "--whatif-runs: want at least 1"),
    ("twin.py", ["--whatif-pairs", "-1"], "--whatif-pairs: want 0 or more"),
    ("twin.py", ["--parts", "whatif", "--caps", "8,32"], "--caps 8,32: the profile's cap 32 is every pair's control"),
    ("twin.py", ["--caps", "8,big"], "--caps: want whole numbers above 0"),
    ("twin.py", ["--sizes", "16,0"], "--sizes: want whole numbers above 0"),
    ("twin.py", ["--parts", "sizes", "--out", "/nonexistent/twin"], "--parts sizes: no twin at /nonexistent/twin/twin.yaml"),
    ("intervals.py", ["old=/nonexistent/validate"], "/nonexistent/validate: no validation.csv"),
    ("drift_baseline.py", ["old=/nonexistent/twin"], "old: /nonexistent/twin holds no profile.json and twin.yaml"),
    ("intervals.py", ["/nonexistent/validate"], "expected NAME=DIR"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, script, args, says):
    out = tmp_path / "result.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and says in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and not out.exists()


def toy_validation(out: Path) -> None:
    """A finished validation in `out` for corrections.py to replay: the toy preset as its profile,
    one held-out workload beside base, a few seconds of traffic."""
    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.validate import validate
    from batchlab.run.config import load_config
    profile = out.parent / "toy.json"
    load_cost("toy").to_json(profile, level="any", fit_rms_rel_error=0.05)
    cfg = load_config(None, ["backend.preset=toy", "traffic.rates=[5]", "traffic.duration_s=4", "traffic.warmup_s=1",
                             "traffic.prompt_len=32", "traffic.output_len=8", "strategies=[continuous]",
                             "validation.workloads={long: {prompt_len: 96}}"])
    validate(cfg, [str(profile)], out)


def test_corrections_keeps_the_coverage_an_earlier_interval_rule_gave_beside_the_new(tmp_path):
    """A record at --json whose intervals were built by another rule keeps its coverage (every
    correction on, per directory) beside the new one; run again under the same rule, nothing doubles."""
    from batchlab.calibrate.validate import INTERVAL
    toy_validation(tmp_path / "v")
    out = tmp_path / "corrections.json"
    on = {"drift": True, "live": True, "first_token": True}
    out.write_text(json.dumps({"command": "earlier", "conditions": {"toy": {"variants": [{"on": on, "coverage": 0.5}]}}}))
    # NOTE: the default combination alone: which record's coverage is kept does not depend on how
    # many combinations the new one judged, and each replays the validation again
    cmd = [sys.executable, str(ROOT / "benchmarks" / "corrections.py"), f"toy={tmp_path / 'v'}", "--json", str(out),
           "--defaults-only"]
    # a missing twin behind the first argument is refused before the first is replayed
    missing = subprocess.run([*cmd[:3], f"other={tmp_path / 'v'}@{tmp_path / 'no.yaml'}", "--json", str(tmp_path / "x.json")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr == f"error: other: no twin config at {tmp_path / 'no.yaml'}\n"
    assert "toy:" not in missing.stdout and not (tmp_path / "x.json").exists()
    for _ in range(2):
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr
        rec = json.loads(out.read_text())
        assert rec["conditions"]["toy"]["interval"] == INTERVAL["held-out"]      # two workloads: the default rule
        assert [(e["command"], e["coverage"]) for e in rec["earlier_intervals"]] == [("earlier", {"toy": 0.5})]
        assert "spread" in rec["earlier_intervals"][0]["interval"]


def test_refit_profile_groups_a_kept_profiles_prompt_samples_and_rewrites_its_twin(tmp_path):
    """A profile written with one prompt-pass sample per stream context is refitted with one per
    (rows, prompt), the median; the twin copy names the new profile; bad input is one line."""
    from batchlab.backends.cost import attention_pairs
    from batchlab.backends.presets import load_cost
    toy = load_cost("toy")
    rows = [{"context_tokens": b * (16 + k), "prefill_tokens": 0, "decode_rows": b, "kind": "decode", "attn_pairs": 0,
             "admitted": 0, "seconds": toy.step_time(b * (16 + k), 0, b)} for b in (1, 2, 4, 8) for k in (2, 10)]
    for p, ctx in [(p, c) for p in (16, 64, 256) for c in (30, 32, 35)]:
        t = toy.step_time(ctx + p, p, 1, attention_pairs(p, 0), 1) * (3.0 if ctx == 35 and p == 256 else 1.0)
        rows.append({"context_tokens": ctx + p, "prefill_tokens": p, "decode_rows": 1, "kind": "prefill",
                     "attn_pairs": attention_pairs(p, 0), "admitted": 1, "seconds": t})
    src = tmp_path / "profile.json"
    toy.to_json(src, level="iteration", samples=rows, fit_rms_rel_error=0.5)
    (tmp_path / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {src}\n")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "refit_profile.py"), str(src), "--out", str(tmp_path / "new.json"),
           "--twin", str(tmp_path / "twin.yaml"), "--twin-out", str(tmp_path / "new.yaml")]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    new = json.loads((tmp_path / "new.json").read_text())
    prefill = [r for r in new["samples"] if r["kind"] == "prefill"]
    assert [(r["prefill_tokens"], r["context_tokens"]) for r in prefill] == [(16, 48), (64, 96), (256, 288)]
    assert new["fit_rms_rel_error"] < 0.05 and new["refitted_from"]["samples"] == len(rows)   # the 3x timing outvoted
    assert str((tmp_path / "new.json").resolve()) in (tmp_path / "new.yaml").read_text()
    split = cmd[:2] + [str(tmp_path / "new.json"), "--out", str(tmp_path / "split.json"), "--front-end", "split"]
    res = subprocess.run(split, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "no reading beside a stream" in res.stderr and not (tmp_path / "split.json").exists()
    new["frontend_s"], new["frontend_beside_s"] = 0.0015, 0.0046
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert subprocess.run(split, cwd=ROOT, capture_output=True, text=True, timeout=300).returncode == 0
    both = json.loads((tmp_path / "split.json").read_text())
    assert (both["frontend_s"], both["first_token_s"]) == pytest.approx((0.0015, 0.0031))
    bad = tmp_path / "nosamples.json"
    toy.to_json(bad, level="iteration")
    res = subprocess.run(cmd[:2] + [str(bad), "--out", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no prompt-pass samples" in res.stderr
    assert not (tmp_path / "x.json").exists()


def test_per_request_reads_a_twin_that_is_the_real_runs_own_simulator_as_exact_in_every_request(tmp_path):
    """The kept 'real' runs come from the toy simulator; the twin is the same simulator with the
    same scheduler, so every request's replay matches it exactly, in every clump and third."""
    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.validate import validate
    from batchlab.run.config import load_config
    profile = tmp_path / "toy.json"
    load_cost("toy").to_json(profile, level="any", fit_rms_rel_error=0.05)
    cfg = load_config(None, ["backend.preset=toy", "traffic.rates=[20]", "traffic.duration_s=4", "traffic.warmup_s=1",
                             "traffic.prompt_len=32", "traffic.output_len=8", "strategies=[continuous]",
                             "validation.workloads={bursty: {arrival: gamma, burstiness: 0.25}}",
                             "validation.noise=false", "validation.saturation=false"])
    validate(cfg, [str(profile)], tmp_path / "v")
    (tmp_path / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {profile}\nstrategies: [continuous]\n")
    out = tmp_path / "per_request.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "per_request.py"), str(tmp_path / "v"), "--twin",
           str(tmp_path / "twin.yaml"), "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    for w in ("base", "bursty"):
        (point,) = rec["workloads"][w].values()
        assert point["requests"] > 20 and point["ratio"] == pytest.approx(1.0)
        assert all(c["ratio"] == pytest.approx(1.0) for c in point["clumps"].values() if c["requests"])
        assert point["thirds"] == pytest.approx([1.0, 1.0, 1.0])
        assert all(c["ratio"] == pytest.approx(1.0) for c in point["in_flight"].values() if c["requests"])
        assert sum(c["requests"] for c in point["in_flight"].values()) == point["requests"]
    assert sum(c["requests"] for c in rec["workloads"]["bursty"]["20"]["clumps"].values()) == rec["workloads"]["bursty"]["20"]["requests"]
    assert rec["workloads"]["bursty"]["20"]["clumps"]["3-4"]["requests"] > 0        # gamma arrivals do clump


def test_in_flight_is_the_mean_count_on_the_server_over_each_decode():
    """A decodes from 1 to 3 s; it is on the server all that time, B from 2 s on, C never: (2 + 1) / 2.
    B decodes 3.5-4 s beside nobody but itself; a failed request (no completion) holds no place."""
    import importlib.util

    import pandas as pd
    spec = importlib.util.spec_from_file_location("per_request", ROOT / "benchmarks" / "per_request.py")
    per_request = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(per_request)
    point = pd.DataFrame({"arrival_time": [0.0, 2.0, 5.0, 1.0], "first_token_time": [1.0, 3.5, 5.5, None],
                          "completion_time": [3.0, 4.0, 6.0, None]})
    got = per_request.in_flight(point, point.iloc[:3])
    assert got == pytest.approx([1.5, 1.0, 1.0])


def test_beside_rows_finds_the_prompt_by_row_term_a_server_has_and_charges_long_prompts_for_it(tmp_path):
    """Samples made by a step model with a prompt-token x decode-row term: the fit with the term
    predicts every prefill step exactly, the fit without it misses beside sixteen streams, and
    the twin with it charges a long prompt among running streams more than the twin without."""
    from dataclasses import asdict

    from batchlab.backends.cost import StepCost, attention_pairs
    from batchlab.calibrate.fit import StepSample
    cost = StepCost(3e-3, 0.0, 5e-7, 4e-5, 2.4e-4, kv_bytes_per_token=1, kv_budget_bytes=1 << 30, prefill_step_s=9e-4,
                    attn_s_per_pair=1e-7, admit_s=1e-3, mix_s_per_token_row=1.5e-6)
    shapes = [(b, b * (ctx + k), 0, b, 0.0, 0) for b in (1, 2, 4, 8, 16, 32) for ctx in (16, 128) for k in (2, 10, 18)]
    shapes += [(b, b * 30 + r * p, r * p, b, r * attention_pairs(p, 0), r)
               for p in (16, 64, 256, 512) for b, r in ((1, 1), (4, 1), (16, 1), (1, 2))]
    samples = [StepSample(ctx, pre, rows, cost.step_time(ctx, pre, rows, pairs, adm),
                          "prefill" if pre else "decode", attn_pairs=pairs, admitted=adm)
               for _, ctx, pre, rows, pairs, adm in shapes]
    profile = tmp_path / "p.json"
    cost.to_json(profile, level="iteration", samples=[asdict(s) for s in samples])
    (tmp_path / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {profile}\nstrategies: [continuous]\n")
    out = tmp_path / "beside.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "beside_rows.py"), str(profile), "--twin",
                          str(tmp_path / "twin.yaml"), "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    err = rec["prefill_error_by_streams"]
    assert all(e["with"] < 1e-6 for e in err.values()) and err["16"]["without"] > 0.01
    assert rec["fits"]["with"]["coefficients"]["mix_s_per_token_row"] == pytest.approx(1.5e-6, rel=1e-4)
    costs = rec["arrival_costs"]
    assert costs["with"]["long_arrival_s"] > costs["without"]["long_arrival_s"]


def test_price_front_end_recovers_a_front_end_added_to_the_twins_own_steps(tmp_path):
    """Inside readings made from the toy twin's steps with no front end plus 2 ms, 10 us a prompt
    token and 0.1 ms a running row: the priced front end is that, the delay the larger reading
    less the 2 ms, and the new twin names the new profile. A rows file without inside readings
    is one line."""
    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.front_end import bare
    from batchlab.calibrate.twin_check import LONG_OUTPUT, LONG_PROMPT, SHORT, Twin, arrival_seconds
    from batchlab.run.config import load_config
    profile = tmp_path / "profile.json"
    load_cost("toy").to_json(profile, level="any", fit_rms_rel_error=0.05, frontend_idle_s=0.005, frontend_beside_s=0.007)
    (tmp_path / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {profile}\nstrategies: [continuous]\n")
    cfg = load_config(str(tmp_path / "twin.yaml"))
    steps = Twin(cfg, cost=bare(cfg.backend.cost())).replay
    within = {}
    for n in (8, 16, 26):
        for p, key in ((SHORT[0], f"{n}x1"), (384, f"{n}x1x384")):
            within[key] = arrival_seconds(steps, 1, (p, 2), (n, LONG_PROMPT, LONG_OUTPUT))[4] + 0.002 + 1e-5 * p + 1e-4 * n
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"conditions": {"quiet": {"rows": {
        "streams": [8, 16, 26], "short": list(SHORT), "long": [384, 2], "rounds_within": [within, within]}}}}))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "price_front_end.py"), str(tmp_path), "--rows", str(rows)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    priced = json.loads((tmp_path / "profile-front-end-within.json").read_text())
    assert priced["frontend_s"] == pytest.approx(0.002, rel=1e-6)
    assert priced["frontend_s_per_token"] == pytest.approx(1e-5, rel=1e-6)
    assert priced["admit_s_per_row"] == pytest.approx(1e-4, rel=1e-6)
    assert priced["first_token_s"] == pytest.approx(0.005, rel=1e-6) and priced["frontend_on_engine"] is True
    assert load_config(str(tmp_path / "twin-front-end-within.yaml")).backend.profile == str(
        (tmp_path / "profile-front-end-within.json").resolve())
    rows.write_text(json.dumps({"conditions": {"quiet": {"rows": {"streams": [16], "rounds": []}}}}))
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.startswith("error: --rows") and res.stderr.count("\n") == 1


def test_corrections_judges_the_default_combination_at_each_gate(tmp_path):
    """--defaults-only --gates 0,2: validate's default corrections, once as measured and once gated; the
    gated replay's record says so in its label and its `on`."""
    toy_validation(tmp_path / "v")
    out = tmp_path / "gates.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "corrections.py"), f"toy={tmp_path / 'v'}",
                          "--gates", "0,2", "--defaults-only", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    variants = rec["conditions"]["toy"]["variants"]
    assert [v["label"] for v in variants] == ["drift probe + live factor + first-token delay",   # validate's default
                                              "drift probe + live factor + first-token delay (gate 2)"]
    assert [v["on"]["gate"] for v in variants] == [0.0, 2.0]
    assert rec["command"].endswith("--gates 0,2 --defaults-only --json " + str(out))
    assert [s["label"] for s in rec["summary"]] == [v["label"] for v in variants]


def test_corrections_reads_what_each_replays_live_profile_scales_the_decode_step_by_off_the_files(tmp_path):
    """live_scales: the written profile's decode step over its source's, per level; a profile 1.3x
    slow, corrected by the drift probe and the live factor on top, writes one at the machine's speed."""
    import importlib.util

    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.validate import validate
    from batchlab.run.config import load_config
    spec = importlib.util.spec_from_file_location("corrections_script", ROOT / "benchmarks" / "corrections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    slow = tmp_path / "slow.json"
    toy = load_cost("toy")
    toy.scaled(1.3).to_json(slow, level="any")
    cfg = load_config(None, ["backend.preset=toy", "traffic.rates=[5]", "traffic.duration_s=4", "traffic.warmup_s=1",
                             "traffic.prompt_len=32", "traffic.output_len=8", "strategies=[continuous]",
                             "validation.workloads={long: {prompt_len: 96}}"])
    validate(cfg, [str(slow)], tmp_path / "v")
    got = mod.live_scales(json.loads((tmp_path / "v" / "accuracy.json").read_text()))
    assert got == {"iteration": pytest.approx(1 / 1.3, rel=0.02)}
    assert mod.live_scales({"live": {}}) == {}


def test_corrections_judges_each_count_of_the_standard_errors(tmp_path):
    """--se-units cells,workloads: the default combination at gate 2 once per count, each replay
    run with that validation.se_units and its record saying which."""
    toy_validation(tmp_path / "v")
    out = tmp_path / "units.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "corrections.py"), f"toy={tmp_path / 'v'}",
                          "--gates", "2", "--se-units", "cells,workloads", "--defaults-only", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    variants = rec["conditions"]["toy"]["variants"]
    assert [v["label"] for v in variants] == [
        "drift probe + live factor + first-token delay (gate 2, standard errors over cells)",
        "drift probe + live factor + first-token delay (gate 2, standard errors over workloads)"]
    assert [v["on"]["se_units"] for v in variants] == ["cells", "workloads"]
    assert "--gates 2 --se-units cells,workloads --defaults-only" in rec["command"]


def test_corrections_sets_an_override_on_every_replay_and_refuses_one_the_config_does_not_take(tmp_path):
    """--set overrides reach every replay's config (the intervals' rule shows it) and are named in
    the record (command and `set`); a value the config refuses is one line before anything is
    replayed."""
    from batchlab.calibrate.validate import INTERVAL
    toy_validation(tmp_path / "v")
    out = tmp_path / "set.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "corrections.py"), f"toy={tmp_path / 'v'}", "--defaults-only"]
    bad = subprocess.run([*cmd, "--set", "validation.drift_against=sometimes", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "drift_against" in bad.stderr and bad.stderr.count("\n") == 1 and not out.exists()
    sets = ["validation.drift_against=prediction", "validation.interval=step-cost"]
    res = subprocess.run([*cmd, *(x for s in sets for x in ("--set", s)), "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    assert rec["set"] == sets
    assert rec["command"].endswith(f"--defaults-only --set {sets[0]} --set {sets[1]} --json {out}")
    # the replays ran under it: the validation was made with held-out intervals, its replays were not
    assert json.loads((tmp_path / "v" / "accuracy.json").read_text())["interval"] == INTERVAL["held-out"]
    assert rec["conditions"]["toy"]["interval"] == INTERVAL["step-cost"]


def test_drift_baseline_puts_the_profiles_one_timing_and_each_validations_beside_the_fits_replay(tmp_path):
    """A profile whose timing of the burst ran 1.3x its own replay: the record says 1.3, and a
    validation's timings read against the replay and against the timing alike."""
    from batchlab.backends.presets import load_cost
    from batchlab.backends.simulated import SimulatedBackend
    from batchlab.calibrate.validate import SERVER, burst_seconds, load_profiles
    d = tmp_path / "twin"
    d.mkdir()
    (d / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {d / 'profile.json'}\nstrategies: [continuous]\n")
    load_cost("toy").to_json(d / "profile.json", level="any", fit_rms_rel_error=0.05)
    prof = load_profiles([], str(d / "twin.yaml"))[SERVER]
    predicted = burst_seconds(SimulatedBackend(prof.cost), SERVER, prof=prof)
    load_cost("toy").to_json(d / "profile.json", level="any", fit_rms_rel_error=0.05, reference_burst_s=1.3 * predicted)
    v = d / "quiet" / "validate"
    (v / "base").mkdir(parents=True)
    (v / "accuracy.json").write_text("{}")
    (v / "base" / "reference.csv").write_text("when,level,seconds\nbefore,server,1.0\nbetween,server,2.0\nafter,server,9.0\n")
    out = tmp_path / "drift.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "drift_baseline.py"), f"t={d}", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    p = json.loads(out.read_text())["profiles"]["t"]
    assert p["timed_over_predicted"] == pytest.approx(1.3) and p["fit_rms"] == pytest.approx(0.05)
    base = p["validations"]["quiet"]["base"]
    assert base["over_prediction"] == pytest.approx(2.0 / predicted)
    assert base["over_profile"] == pytest.approx(2.0 / (1.3 * predicted))


def test_a_repeated_what_if_prediction_is_the_same_figures_to_the_last_bits_only():
    import importlib.util
    spec = importlib.util.spec_from_file_location("twin_script", ROOT / "benchmarks" / "twin.py")
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    a = {"tok_s": 1941.8204305800464, "req_s": 60.68188845562645, "failed": 0}
    assert twin.same_figures(a, a | {"tok_s": 1941.8204305800466})
    assert not twin.same_figures(a, a | {"tok_s": 1942.0})
    assert not twin.same_figures(a, a | {"failed": 1}) and not twin.same_figures(a, {"tok_s": 1941.8204305800464})


def _reach_profile(tmp_path: Path, beyond: float) -> Path:
    """A profile directory whose decode steps follow the toy preset, those of more than 32 rows
    `beyond` times as long, with prompt passes beside one stream; its twin config beside it."""
    from batchlab.backends.cost import attention_pairs
    from batchlab.backends.presets import load_cost
    toy = load_cost("toy")
    rows = [{"context_tokens": b * (16 + k), "prefill_tokens": 0, "decode_rows": b, "kind": "decode",
             "seconds": toy.step_time(b * (16 + k), 0, b) * (beyond if b > 32 else 1.0)}
            for b in (1, 2, 4, 8, 16, 32, 64, 128) for k in (2, 6, 10, 14)]
    rows += [{"context_tokens": 48 + p, "prefill_tokens": p, "decode_rows": 1, "kind": "prefill", "admitted": 1,
              "attn_pairs": attention_pairs(p, 0), "seconds": toy.step_time(48 + p, p, 1, attention_pairs(p, 0), 1)}
             for p in (16, 64, 256, 512)]
    d = tmp_path / f"reach-{beyond:g}"
    d.mkdir()
    toy.to_json(d / "profile.json", level="iteration", samples=rows, grid={"batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128]})
    (d / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {d / 'profile.json'}\nstrategies: [continuous]\n"
                                 "continuous: {max_num_seqs: 128}\n")
    return d


def test_refits_prices_the_rows_past_a_small_fit_from_the_bigger_steps(tmp_path):
    """Steps 1.5x as long past 32 rows: the fit on at most 32 rows with the rows past priced from
    the bigger steps reads them nearer than the fit on at most 32 rows alone, its steps up to 32 as that fit's."""
    d = _reach_profile(tmp_path, 1.5)
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d), "--rows", "32", "--past-rows",
                          "--json", str(d / "refits.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rec = json.loads((d / "refits.json").read_text())
    past, small = "fit on ≤ 32 rows, rows past priced", "fit on ≤ 32 rows"
    assert rec["fits"][past]["rows_profiled"] == 32 and rec["fits"][past]["beyond_s_per_row"] > 0
    for b in rec["batches"]:
        v = b["variants"]
        if b["rows"] > 32:
            assert abs(v[past]["error"]) < abs(v[small]["error"]), b
        else:
            assert v[past]["predicted_s"] == pytest.approx(v[small]["predicted_s"]), b


def test_refits_shows_what_a_fit_on_small_batches_misses_beyond_them(tmp_path):
    """Steps that keep the toy's straight lines past 32 rows: every variant predicts them, and each
    variant's twin (written beside the profile's) bursts as the profile's own. Steps 1.5x as long
    past 32 rows: the fit on at most 32 rows reads them a third short."""
    from batchlab.calibrate.twin_check import Twin, predicted_burst
    from batchlab.run.config import load_config
    straight = _reach_profile(tmp_path, 1.0)
    own = Twin(load_config(straight / "twin.yaml"))
    caps = [{"cap": cap, "measured": [predicted_burst(own, 48, 16, 8, max_num_seqs=cap)] * 2} for cap in (32, 8, 128)]
    record = tmp_path / "whatif.json"
    record.write_text(json.dumps({"conditions": {"quiet": {"whatif": {
        "burst": {"requests": 48, "prompt": 16, "output": 8}, "caps": caps}}}}))
    script = [sys.executable, str(ROOT / "benchmarks" / "refits.py")]
    for d in (straight, _reach_profile(tmp_path, 1.5)):
        res = subprocess.run([*script, str(d), "--rows", "32", "--without", "admit_s", "--whatif", str(record),
                              "--json", str(d / "refits.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
    exact = json.loads((straight / "refits.json").read_text())
    names = ["as profiled", "fit on ≤ 32 rows", "without admit_s"]
    assert list(exact["fits"]) == names and exact["fits"]["without admit_s"]["admit_s"] == 0
    assert all(abs(b["variants"][n]["error"]) < 0.01 for b in exact["batches"] for n in names)
    (w,) = exact["whatif"]
    assert w["base_cap"] == 32 and all(c["variants"]["as profiled"][k] == pytest.approx(m["measured"][0][k])
                                       for c, m in zip(w["caps"], caps) for k in ("tok_s", "tpot_p50"))
    assert str((straight / "profile-rows-le-32.json").resolve()) in (straight / "twin-rows-le-32.yaml").read_text()
    bent = {b["rows"]: b["variants"] for b in json.loads((tmp_path / "reach-1.5" / "refits.json").read_text())["batches"]}
    assert bent[128]["fit on ≤ 32 rows"]["error"] == pytest.approx(1 / 1.5 - 1, abs=0.02)
    assert bent[128]["as profiled"]["error"] == pytest.approx(1 / 1.5 - 1, abs=0.02)   # the toy itself: straight lines
    # a cap the what-if never measured, or a file that is no what-if: one line, no variant written
    fresh = _reach_profile(tmp_path, 2.0)
    for bad, says in ((["--whatif", str(record), "--base-cap", "64"], "--base-cap 64:"),
                      (["--whatif", str(fresh / "twin.yaml")], "not a benchmarks/twin.py record")):
        res = subprocess.run([*script, str(fresh), "--rows", "32", *bad, "--json", str(tmp_path / "x.json")],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 2 and says in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert sorted(f.name for f in fresh.iterdir()) == ["profile.json", "twin.yaml"]
    # a profile with no step beyond --rows cannot be judged: one line, nothing written
    res = subprocess.run([*script, str(straight), "--rows", "128", "--json", str(tmp_path / "x.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "no step of more than 128 rows" in res.stderr and not (tmp_path / "x.json").exists()


def test_refits_fits_an_opt_in_term_and_judges_each_twin_on_bursts_of_several_sizes(tmp_path):
    """Steps priced for attention over the whole batch, profiled to 32 rows: the straight lines
    carried past 32 run a burst of 128 at once faster than the steps did; the variant fitted with
    the term runs it as they did. The bursts' record is the true steps' own twin."""
    from dataclasses import replace

    from batchlab.backends.cost import attention_pairs
    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.twin_check import Twin, predicted_whole_burst
    from batchlab.run.config import load_config
    truth = replace(load_cost("toy"), dense_s_per_pair=2e-9)
    rows = [{"context_tokens": b * (c + k), "prefill_tokens": 0, "decode_rows": b, "kind": "decode",
             "seconds": truth.step_time(b * (c + k), 0, b)} for b in (1, 2, 4, 8, 16, 32) for c in (16, 128) for k in (2, 6, 10)]
    rows += [{"context_tokens": 48 + p, "prefill_tokens": p, "decode_rows": 1, "kind": "prefill", "admitted": 1,
              "attn_pairs": attention_pairs(p, 0), "seconds": truth.step_time(48 + p, p, 1, attention_pairs(p, 0), 1)}
             for p in (16, 64, 256, 512)]
    d, real = tmp_path / "dense", tmp_path / "real"
    for path, cost in ((d, load_cost("toy")), (real, truth)):
        path.mkdir()
        cost.to_json(path / "profile.json", level="iteration", samples=rows, grid={"batch_sizes": [1, 2, 4, 8, 16, 32]})
        (path / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {path / 'profile.json'}\nstrategies: [continuous]\n"
                                        "continuous: {max_num_seqs: 256}\n")
    server = Twin(load_config(real / "twin.yaml"))
    record = tmp_path / "sizes.json"
    record.write_text(json.dumps({"conditions": {"quiet": {"sizes": {"burst": {"prompt": 128, "output": 8}, "sizes": [
        {"requests": n, "measured": [predicted_whole_burst(server, n, 128, 8)] * 2} for n in (16, 128)]}}}}))
    script = [sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d)]
    res = subprocess.run([*script, "--with", "dense_s_per_pair", "--sizes", str(record), "--json", str(d / "refits.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rec = json.loads((d / "refits.json").read_text())
    dense = "with dense_s_per_pair"
    assert rec["fits"][dense]["dense_s_per_pair"] == pytest.approx(2e-9, rel=1e-3)
    assert json.loads((d / "profile-with-dense_s_per_pair.json").read_text())["grid"]["terms"] == ["dense_s_per_pair"]
    (s,) = rec["sizes"]
    at = {row["requests"]: row for row in s["sizes"]}
    assert at[128]["variants"][dense]["span_tok_s"] == pytest.approx(at[128]["measured"]["span_tok_s"], rel=0.01)
    assert at[128]["variants"]["as profiled"]["span_tok_s"] > 1.2 * at[128]["measured"]["span_tok_s"]
    for bad, says in ((["--with", "admit_s"], "not an opt-in step-time term"),
                      (["--sizes", str(d / "twin.yaml")], "not a benchmarks/twin.py record")):
        res = subprocess.run([*script, "--rows", "16", *bad, "--json", str(tmp_path / "x.json")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 2 and says in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert not (tmp_path / "x.json").exists()


def test_refits_reads_a_cap_measured_beside_its_control_pair_by_pair(tmp_path):
    d = _reach_profile(tmp_path, 1.0)
    ctl = [{"tok_s": 1000.0, "tpot_p50": 0.02, "ttft_p50": 0.5}, {"tok_s": 500.0, "tpot_p50": 0.04, "ttft_p50": 1.0},
           {"tok_s": 800.0, "tpot_p50": 0.025, "ttft_p50": 0.6}]
    mine = [{"tok_s": 1200.0, "tpot_p50": 0.03, "ttft_p50": 0.5}, {"tok_s": 600.0, "tpot_p50": 0.06, "ttft_p50": 1.0},
            {"tok_s": 1040.0, "tpot_p50": 0.03, "ttft_p50": 0.6}]
    record = tmp_path / "paired.json"
    record.write_text(json.dumps({"conditions": {"quiet": {"whatif": {
        "burst": {"requests": 48, "prompt": 16, "output": 8}, "pairs": 3,
        "caps": [{"cap": 32, "measured": ctl}, {"cap": 128, "measured": mine, "control": ctl}]}}}}))
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d), "--rows", "32", "--whatif",
                          str(record), "--json", str(d / "refits.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (w,) = json.loads((d / "refits.json").read_text())["whatif"]
    change = w["caps"][1]["change"]["measured"]
    # each pair +20 % (the caps' medians would say +30 %), TPOT +50, +50 and +20 %
    assert change["tok_s"] == pytest.approx(0.2) and change["tpot_p50"] == pytest.approx(0.5)
    assert w["caps"][1]["measured"]["tok_s"] == 1040.0          # the burst itself: the median of its runs


def test_refits_carries_rows_past_the_profile_and_refuses_a_front_end_it_never_read(tmp_path):
    d = _reach_profile(tmp_path, 1.0)
    script = [sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d)]
    res = subprocess.run([*script, "--beyond-rows", "--json", str(d / "refits.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    fit = json.loads((d / "refits.json").read_text())["fits"]["rows past the profile"]
    assert fit["rows_profiled"] == 128 and fit["beyond_s_per_row"] == pytest.approx(0.0, abs=1e-9)   # straight lines
    assert json.loads((d / "profile-beyond-rows.json").read_text())["rows_profiled"] == 128
    # the toy's record holds no idle front-end reading: one line, no variant written
    before = sorted(f.name for f in d.iterdir())
    res = subprocess.run([*script, "--front-end-idle", "--json", str(tmp_path / "x.json")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "no idle front-end reading" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert sorted(f.name for f in d.iterdir()) == before and not (tmp_path / "x.json").exists()
    # a variant refused after another was asked for: neither written
    fresh = _reach_profile(tmp_path, 2.0)
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(fresh), "--beyond-rows", "--rows",
                          "128", "--json", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "no step of more than 128 rows" in res.stderr, res.stderr
    assert sorted(f.name for f in fresh.iterdir()) == ["profile.json", "twin.yaml"]


def test_refits_on_steps_of_one_admission_cannot_tell_a_pass_from_an_admission_and_crowds_can(tmp_path):
    """Prompt steps priced as a pass's setup and nothing per admission: with one admission a step
    the fit sees only the two prices' sum and may charge either; steps admitting 4 and 8 pin the
    setup to the pass, and the fit on every step reads them exactly."""
    from dataclasses import replace

    from batchlab.backends.cost import attention_pairs
    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.fit import fit_step_times, samples_from
    cost = replace(load_cost("toy"), prefill_step_s=0.004, admit_s=0.0)
    rows = [{"context_tokens": b * (16 + k), "prefill_tokens": 0, "decode_rows": b, "kind": "decode",
             "seconds": cost.step_time(b * (16 + k), 0, b)} for b in (1, 2, 4, 8, 16, 32) for k in (2, 6, 10, 14)]
    rows += [{"context_tokens": 48 + n * p, "prefill_tokens": n * p, "decode_rows": 1, "admitted": n,
              "kind": "crowd" if n > 1 else "prefill", "attn_pairs": n * attention_pairs(p, 0),
              "seconds": cost.step_time(48 + n * p, n * p, 1, n * attention_pairs(p, 0), n)}
             for p in (16, 64, 256) for n in ((1, 4, 8) if p < 256 else (1,))]
    d = tmp_path / "crowd"
    d.mkdir()
    fitted = fit_step_times(samples_from(rows)).to_cost(cost)       # as `batchlab profile` fits every step
    fitted.to_json(d / "profile.json", level="iteration", samples=rows, grid={"batch_sizes": [1, 2, 4, 8, 16, 32]})
    (d / "twin.yaml").write_text(f"backend:\n  kind: sim\n  profile: {d / 'profile.json'}\nstrategies: [continuous]\n")
    script = [sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d)]
    res = subprocess.run([*script, "--admitted", "1", "--json", str(d / "refits.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rec = json.loads((d / "refits.json").read_text())
    assert list(rec["fits"]) == ["as profiled", "fit on ≤ 1 admissions"]
    assert rec["fits"]["as profiled"]["prefill_step_s"] == pytest.approx(0.004, rel=0.01)
    assert rec["fits"]["as profiled"]["admit_s"] == pytest.approx(0.0, abs=1e-5)
    by = {a["admitted"]: a for a in rec["admissions"]}
    assert sorted(by) == [1, 4, 8] and by[8]["steps"] == 2 and by[8]["prompt_tokens"] == [128, 512]
    assert all(abs(a["variants"]["as profiled"]["error"]) < 0.01 for a in rec["admissions"])
    one = rec["fits"]["fit on ≤ 1 admissions"]
    assert one["prefill_step_s"] + one["admit_s"] == pytest.approx(0.004, rel=0.01)    # only their sum is seen
    assert str((d / "profile-admitted-le-1.json").resolve()) in (d / "twin-admitted-le-1.yaml").read_text()
    # no step admits more than asked: nothing to tell apart, one line, nothing written
    res = subprocess.run([*script, "--admitted", "8", "--json", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "no step admitting more than 8 requests" in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "x.json").exists() and not (d / "profile-admitted-le-8.json").exists()


def test_intervals_rejudges_a_kept_validation_under_each_rule_without_running_it_again(tmp_path):
    """The step-cost rule re-judged from validation.csv's columns reads what validate recorded; the
    held-out rule is judged beside it; a second directory named the same is refused, nothing written;
    a copy of the directory's validation.csv reads the same."""
    import pandas as pd
    toy_validation(tmp_path / "v")
    out = tmp_path / "intervals.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "intervals.py"), f"toy={tmp_path / 'v'}"]
    res = subprocess.run([*cmd, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())["validations"]["toy"]
    kept = pd.read_csv(tmp_path / "v" / "validation.csv")
    assert rec["step-cost"]["coverage"] == pytest.approx(kept["inside"].mean()) and rec["step-cost"]["cells"] == len(kept)
    assert set(rec["held-out"]["by_metric"]) == set(kept["metric"])
    twice = subprocess.run([*cmd, f"toy={tmp_path / 'v'}", "--json", str(tmp_path / "x.json")], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert twice.returncode == 2 and twice.stderr == "error: 'toy' named twice\n" and not (tmp_path / "x.json").exists()
    # a copy of validation.csv (as docs/results/cells/ keeps them) is judged as its directory is
    copy = tmp_path / "cells" / "toy-quiet.csv"
    copy.parent.mkdir()
    copy.write_text((tmp_path / "v" / "validation.csv").read_text())
    res = subprocess.run([*cmd[:2], f"toy={copy}", "--json", str(tmp_path / "c.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "c.json").read_text())["validations"]["toy"] == rec


def test_a_paired_what_if_alternates_abba_between_two_servers_up_at_once(tmp_path, monkeypatch):
    from contextlib import contextmanager
    from types import SimpleNamespace
    spec = importlib.util.spec_from_file_location("twin_paired", ROOT / "benchmarks" / "twin.py")
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    monkeypatch.setattr(twin.process, "split_cores", lambda: None)     # the test process stays where it is
    up, started, sent, spent = [], [], [], {1: 0.0, 2: 0.0}

    @contextmanager
    def server(self, beside=False, **limits):
        cap = limits.get("max_num_seqs", self.cfg.continuous.max_num_seqs)
        up.append(cap)
        started.append(cap)
        self.running = SimpleNamespace(pid=2 if beside else 1)
        yield None, cap                                  # the "backend" is the cap it serves
        up.remove(cap)

    def saturated(backend, n, p, o):
        assert len(up) == 2, "both servers are up while the pairs run"
        sent.append(backend)
        spent[1 if backend != 32 else 2] += 0.5          # the waiting server spends half a second a burst
        return {"tok_s": 1000.0 * backend / 32, "tpot_p50": 0.02, "failed": 0}

    monkeypatch.setattr(twin.Campaign, "server", server)
    monkeypatch.setattr(twin.Campaign, "twin", lambda self: None)
    monkeypatch.setattr(twin, "predicted_burst", lambda t, n, p, o, max_num_seqs: {"tok_s": float(max_num_seqs)})
    monkeypatch.setattr(twin.compare, "saturated", saturated)
    monkeypatch.setattr(twin, "usage", lambda pid: SimpleNamespace(user_s=spent[pid], system_s=0.0))
    (tmp_path / "twin.yaml").write_text("# the profile part's twin; the test predicts nothing from it\n")
    args = twin.parse_args([str(ROOT / "configs" / "twin-vllm.yaml"), "--parts", "whatif", "--whatif-pairs", "3",
                            "--caps", "8,128", "--out", str(tmp_path), "--json", str(tmp_path / "twin.json")])
    twin.run(twin.Campaign(args, "twin.py --whatif-pairs 3"), ["whatif"])
    assert started == [32, 8, 32, 128]                  # no server of its own for the first part: none measures there
    assert sent == [32, 8, 8, 32, 32, 8, 32, 128, 128, 32, 32, 128]
    w = json.loads((tmp_path / "twin.json").read_text())["conditions"]["quiet"]["whatif"]
    assert w["pairs"] == 3 and [c["cap"] for c in w["caps"]] == [32, 8, 128]
    assert len(w["caps"][0]["measured"]) == 6 and "control" not in w["caps"][0]
    assert [r["tok_s"] for r in w["caps"][2]["control"]] == [1000.0] * 3
    assert [r["tok_s"] for r in w["caps"][2]["measured"]] == [4000.0] * 3
    assert {r["beside_cpu_s"] for c in w["caps"][1:] for r in c["measured"] + c["control"]} == {0.5}
    assert w["caps"][1]["predicted"] == {"tok_s": 8.0}


def test_refits_prices_the_front_end_as_before_the_hand_over_and_refuses_a_profile_without_one(tmp_path):
    d = _reach_profile(tmp_path, 1.0)
    script = [sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d), "--priced-front-end"]
    res = subprocess.run([*script, "--json", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2 and "no hand-over reading" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert sorted(f.name for f in d.iterdir()) == ["profile.json", "twin.yaml"] and not (tmp_path / "x.json").exists()
    # a profile whose hand-over moved the front end's engine time from 0.5 to 1.5 ms (of 4 ms before the scheduler)
    prof = json.loads((d / "profile.json").read_text())
    moved = {"frontend_on_engine": True, "frontend_s": 0.0015, "first_token_s": 0.0025, "frontend_idle_s": 0.0005,
             "frontend_beside_s": 0.004, "hand_over": {"priced_s": 0.0005, "engine_s": 0.0015}}
    (d / "profile.json").write_text(json.dumps(prof | moved))
    res = subprocess.run([*script, "--json", str(d / "refits.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    fits = json.loads((d / "refits.json").read_text())["fits"]
    assert fits["as profiled"]["frontend_s"] == 0.0015 and fits["as profiled"]["first_token_s"] == 0.0025
    assert fits["front end as priced"]["frontend_s"] == 0.0005
    assert fits["front end as priced"]["first_token_s"] == pytest.approx(0.0035)


def test_refits_fits_the_hand_over_from_starts_that_ignore_the_arrival_probe(tmp_path):
    from batchlab.backends.cost import StepCost
    from batchlab.calibrate import handover as H
    from batchlab.calibrate.twin_check import Twin
    from batchlab.run.config import load_config
    d = _reach_profile(tmp_path, 1.0)
    prof = json.loads((d / "profile.json").read_text()) | {"frontend_idle_s": 0.003, "frontend_beside_s": 0.004}
    # the server's rounds: what the toy's twin does with 1 ms of front end on its engine a request
    bounds = ["1", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096", "8192", "16384", "inf"]
    twin = Twin(load_config(d / "twin.yaml"))
    server = H.on_twin(twin, H.engine_time(StepCost.from_record(prof), 0.001, 0.004), H.HandOverProbe(), bounds)
    prof["hand_over"] = {"server": [server] * 3, "probe": {"requests": 32, "prompt": 64, "output": 2, "rounds": 3}}
    (d / "profile.json").write_text(json.dumps(prof))
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d), "--hand-over-from", "0,idle",
                          "--json", str(d / "refits.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    fits = json.loads((d / "refits.json").read_text())["fits"]
    assert list(fits) == ["as profiled", "front end 0.00 ms", "hand-over from 0.00 ms", "front end 3.00 ms (idle)",
                          "hand-over from 3.00 ms (idle)"]
    assert fits["front end 0.00 ms"]["frontend_s"] == 0 and fits["front end 3.00 ms (idle)"]["frontend_s"] == 0.003
    for start in ("0", "idle"):
        fitted = json.loads((d / f"profile-hand-over-from-{start}.json").read_text())
        assert fitted["hand_over"]["apart"] == 0 and fitted["frontend_on_engine"]
        assert fitted["frontend_s"] + fitted["first_token_s"] == pytest.approx(0.004)
    # each takes the engine time nearest its start that splits as the server did: from 0, the least of them
    assert 0 < fits["hand-over from 0.00 ms"]["frontend_s"] <= fits["hand-over from 3.00 ms (idle)"]["frontend_s"]
    # a start that is no number: one line, nothing written
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "refits.py"), str(d), "--hand-over-from", "soon"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "--hand-over-from: want milliseconds" in res.stderr, res.stderr
