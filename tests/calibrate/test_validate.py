from dataclasses import replace

import pandas as pd
import pytest
from click.testing import CliRunner

from batchlab.backends.presets import load_cost
from batchlab.calibrate.validate import INTERVAL, load_profiles, profile_for, report_lines, sim_cost, validate, validate_cmd
from batchlab.errors import ConfigError
from batchlab.run.config import load_config

TIME_FIELDS = ("overhead_s", "weight_s", "kv_s_per_token", "prefill_s_per_token", "decode_s_per_row", "prefill_step_s")


def toy_profile(tmp_path, level="any", name="toy.json", scale=1.0):
    """The toy preset as a profile; `scale` multiplies every step-time term (a miscalibration)."""
    path = tmp_path / name
    toy = load_cost("toy")
    replace(toy, **{k: scale * getattr(toy, k) for k in TIME_FIELDS}).to_json(path, level=level)
    return str(path)


# a server profile's twin: its scheduler on the simulator (a profile of a server always has one)
TOY_TWIN = load_config(None, ["backend.preset=toy", "strategies=[continuous]"])
BASE = ["backend.preset=toy", "traffic.rates=[5,20]", "traffic.duration_s=8", "traffic.warmup_s=1",
        "traffic.prompt_len=32", "traffic.output_len=16"]


def by_cell(v, metric):
    t = v.cells[(v.cells["metric"] == metric) & (v.cells["kind"] == "latency")]
    return t.set_index(["workload", "strategy", "rate"])


def test_validation_detects_step_times_that_are_30_percent_too_slow(tmp_path):
    # The "real" run is the toy preset; the profile claims every step costs 1.3x as much. Without the
    # drift correction (which would read that as the machine running faster today: next test)
    cfg = load_config(None, BASE + ["validation.drift=false"])
    v = validate(cfg, [toy_profile(tmp_path, scale=1.3)], tmp_path / "v")
    tpot, ttft = by_cell(v, "tpot_p50"), by_cell(v, "ttft_p50")
    assert len(tpot) == 6
    # TPOT is step time alone: +30% everywhere
    assert tpot["error"].to_numpy() == pytest.approx(0.30, abs=0.01)
    # continuous TTFT is one prefill step at light load: +30%; request-level TTFT is mostly the
    # wait for a batch to fill, which the step time barely moves
    assert ttft.loc[("base", "continuous", 5.0), "error"] == pytest.approx(0.30, abs=0.01)
    assert abs(ttft.loc[("base", "naive", 5.0), "error"]) < 0.05
    # throughput is judged on a saturated burst, where the backend sets it: 1/1.3 - 1 = -23%,
    # where below capacity (the trace sets it) the same profile was within 1%
    sat = v.cells[v.cells["kind"] == "saturation"]
    assert len(sat) == 3 and sat["error"].to_numpy() == pytest.approx(1 / 1.3 - 1, abs=0.02)
    below = pd.read_csv(tmp_path / "v" / "base" / "real" / "summary.csv")["throughput_tok_s"]
    assert below.notna().all()
    lines = report_lines(v)
    assert any(line.startswith("tpot_p50") and "30.0% / 30.0%" in line and ": no" in line for line in lines)
    for name in ("validation.csv", "accuracy.json", "validation.png"):
        assert (tmp_path / "v" / name).is_file()
    # secondary: the exact profile reproduces the run (the simulator is deterministic)
    exact = validate(cfg, [toy_profile(tmp_path, name="exact.json")], tmp_path / "e")
    assert exact.cells["error"].abs().max() == 0.0


def test_drift_correction_absorbs_a_uniform_speed_change_but_not_a_wrong_shape(tmp_path):
    import json
    # uniform: the profile is 1.3x slow everywhere, as a machine 1.3x faster today than when profiled
    v = validate(load_config(None, BASE + ["strategies=[dynamic,continuous]", "validation.drift=apply"]),
                 [toy_profile(tmp_path, scale=1.3)], tmp_path / "u")
    acc = json.loads((tmp_path / "u" / "accuracy.json").read_text())
    assert {k: v["factor"] for k, v in acc["drift"]["base"].items()} == {"request": pytest.approx(1 / 1.3),
                                                                         "iteration": pytest.approx(1 / 1.3)}
    assert all(v["spread"] < 1e-9 for v in acc["drift"]["base"].values())    # a simulator times the same burst alike
    assert v.cells["error"].abs().max() < 1e-9
    assert acc["uncorrected"]["tpot_p50"]["error_median"] == pytest.approx(0.30, abs=0.01)   # what it absorbed
    ref = pd.read_csv(tmp_path / "u" / "base" / "reference.csv")
    assert list(ref["when"]) == ["before"] * 2 + ["between"] * 2 + ["after"] * 2
    # shape: only the per-row decode cost is off (x3): one scale cannot make it right everywhere
    path = tmp_path / "shape.json"
    toy = load_cost("toy")
    replace(toy, decode_s_per_row=3 * toy.decode_s_per_row).to_json(path, level="any")
    v = validate(load_config(None, BASE + ["strategies=[continuous]", "validation.drift=true"]), [str(path)], tmp_path / "s")
    assert v.cells["error"].abs().max() > 0.02


def test_by_default_the_drift_probe_against_the_fits_replay_scales_the_replays(tmp_path):
    """validation.drift: apply and drift_against: prediction (the defaults): a profile that reads
    every step 1.3x slow is a machine 1.3x faster today, and the replays absorb it."""
    import json
    cfg = load_config(None, BASE + ["strategies=[continuous]"])
    assert (cfg.validation.drift, cfg.validation.drift_against) == ("apply", "prediction")
    v = validate(cfg, [toy_profile(tmp_path, scale=1.3)], tmp_path / "a")
    drift = json.loads((tmp_path / "a" / "accuracy.json").read_text())["drift"]["base"]["iteration"]
    assert drift["factor"] == pytest.approx(1 / 1.3) and drift["against"] == "prediction" and drift["applied"] is True
    assert by_cell(v, "tpot_p50")["error"].abs().max() < 1e-9


def test_measure_times_the_drift_probe_and_records_it_but_scales_nothing(tmp_path):
    """validation.drift: measure: the reference bursts are timed and their factor kept in
    accuracy.json, not applied, so the replays are those with the probe off."""
    import json
    cfg = load_config(None, BASE + ["strategies=[continuous]", "validation.drift=measure"])
    v = validate(cfg, [toy_profile(tmp_path, scale=1.3)], tmp_path / "m")
    acc = json.loads((tmp_path / "m" / "accuracy.json").read_text())
    assert acc["drift"]["base"]["iteration"]["factor"] == pytest.approx(1 / 1.3)
    assert acc["drift"]["base"]["iteration"]["applied"] is False
    assert (tmp_path / "m" / "base" / "reference.csv").is_file()
    off = validate(load_config(None, BASE + ["strategies=[continuous]", "validation.drift=false"]),
                   [toy_profile(tmp_path, scale=1.3)], tmp_path / "o")
    assert off.cells["sim"].tolist() == v.cells["sim"].tolist() and not (tmp_path / "o" / "base" / "reference.csv").exists()
    assert by_cell(v, "tpot_p50")["error"].to_numpy() == pytest.approx(0.30, abs=0.01)     # the 1.3x not absorbed
    with pytest.raises(ConfigError, match="drift"):
        load_config(None, BASE + ["validation.drift=sometimes"])


def test_the_live_profile_runs_at_the_validations_speed_whether_the_drift_probe_or_the_live_factor_read_it(tmp_path):
    """The live factor is measured on replays already scaled by the drift probe, so the profile
    written with it carries the drift too: applied or only measured, the machine 1.3x faster than
    the profile says comes out of the written profile alike."""
    import json
    three = BASE + ["strategies=[continuous]",
                    "validation.workloads={bursty: {arrival: gamma, burstiness: 0.25}, long: {prompt_len: 200}}"]
    written = {}
    for mode in ("apply", "measure"):
        validate(load_config(None, three + [f"validation.drift={mode}"]), [toy_profile(tmp_path, scale=1.3)], tmp_path / mode)
        pooled = json.loads((tmp_path / mode / "accuracy.json").read_text())["live"]["pooled"]["iteration"]
        written[mode] = (pooled, json.loads(open(pooled["profile"]).read()))
    (applied, prof_a), (measured, prof_m) = written["apply"], written["measure"]
    assert applied["drift"] == pytest.approx(1 / 1.3) and applied["factor"] == pytest.approx(1.0, abs=0.02)
    assert measured["drift"] == 1.0 and measured["factor"] == pytest.approx(1 / 1.3, rel=0.02)
    assert prof_a["drift_factor"] == pytest.approx(1 / 1.3)
    toy = load_cost("toy").decode_s_per_row
    assert prof_a["decode_s_per_row"] == pytest.approx(toy, rel=0.02) and prof_m["decode_s_per_row"] == pytest.approx(toy, rel=0.02)
    from batchlab.calibrate.validate import live_lines
    said = live_lines(json.loads((tmp_path / "apply" / "accuracy.json").read_text())["live"], True, "delay")
    assert any("on the drift probe's 0.77x" in line for line in said)


def test_the_noise_floor_is_a_second_run_of_the_same_traces(tmp_path):
    # The simulator is deterministic, so a simulated "real" backend reruns exactly: a zero floor,
    # and a rerun directory with the same requests as the first run
    cfg = load_config(None, BASE + ["strategies=[continuous]"])
    v = validate(cfg, [toy_profile(tmp_path)], tmp_path / "v")
    assert v.cells["noise"].abs().max() == 0.0
    first, again = (pd.read_csv(tmp_path / "v" / "base" / d / "requests.csv") for d in ("real", "rerun"))
    assert first[["arrival_time", "prompt_len", "output_len"]].equals(again[["arrival_time", "prompt_len", "output_len"]])
    off = validate(load_config(None, BASE + ["strategies=[continuous]", "validation.noise=false"]),
                   [toy_profile(tmp_path)], tmp_path / "off")
    assert off.cells["noise"].isna().all() and not (tmp_path / "off" / "base" / "rerun").exists()


def test_held_out_workloads_run_their_own_traffic(tmp_path):
    cfg = load_config(None, BASE + ["strategies=[continuous]", "validation.workloads={bursty: {arrival: gamma, "
                                    "burstiness: 0.25}, long: {prompt_len: 200}}"])
    v = validate(cfg, [toy_profile(tmp_path, scale=1.3)], tmp_path / "v")
    assert list(dict.fromkeys(v.cells["workload"])) == ["base", "bursty", "long"]
    long = pd.read_csv(tmp_path / "v" / "long" / "real" / "requests.csv")
    assert (long["prompt_len"] == 200).all()
    # a run directory's config is the workload's own run config: no validation section in it
    assert "validation" not in (tmp_path / "v" / "bursty" / "real" / "config.yaml").read_text()
    assert "gamma" in (tmp_path / "v" / "bursty" / "real" / "config.yaml").read_text()
    assert set(v.summary["metric"]) == {"e2e_p50", "ttft_p50", "tpot_p50", "ttft_p99", "throughput_tok_s"}
    assert (v.summary["cells"] == [6, 6, 6, 6, 3]).all()


def test_a_killed_validation_resumes_keeping_the_real_runs(tmp_path, monkeypatch):
    import batchlab.calibrate.validate as val
    cfg = load_config(None, BASE + ["strategies=[continuous]"])
    calls = []
    real_run_point = val.run_point

    def dies_on_the_second_real_burst(cfg, strategy, rate, repeat, backend, trace=None):
        if trace and all(t.arrival == 0.0 for t in trace):      # a saturation burst (real comes first)
            calls.append(strategy)
            if len(calls) == 2:
                raise KeyboardInterrupt
        return real_run_point(cfg, strategy, rate, repeat, backend, trace)

    monkeypatch.setattr(val, "run_point", dies_on_the_second_real_burst)
    with pytest.raises(KeyboardInterrupt):
        validate(cfg, [toy_profile(tmp_path)], tmp_path / "v")
    saved = pd.read_csv(tmp_path / "v" / "base" / "saturation.csv")
    assert list(saved["side"]) == ["real"]          # the first burst was kept, nothing half-written
    monkeypatch.setattr(val, "run_point", real_run_point)
    v = validate(cfg, [toy_profile(tmp_path)], tmp_path / "v")
    saved = pd.read_csv(tmp_path / "v" / "base" / "saturation.csv")
    assert list(saved["side"]) == ["real", "real_b"]   # only real bursts are kept; replays are recomputed
    assert len(v.cells) == 2 * 4 + 1


def test_workloads_are_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match="validation.workloads.x: traffic arrival"):
        load_config(None, ["validation.workloads={x: {arrival: nope}}"])
    with pytest.raises(ConfigError, match="'base' is the config's own traffic"):
        load_config(None, ["validation.workloads={base: {}}"])


def test_profiles_are_matched_to_each_strategys_path(tmp_path):
    profiles = load_profiles([toy_profile(tmp_path, "request", "r.json"), toy_profile(tmp_path, "iteration", "i.json")])
    assert profile_for("dynamic", profiles).path.endswith("r.json")
    assert profile_for("continuous", profiles).path.endswith("i.json")
    only_iter = load_profiles([toy_profile(tmp_path, "iteration", "i.json"), toy_profile(tmp_path, "iteration", "j.json")])
    only_iter["other"] = only_iter.pop("iteration")
    only_iter["iteration"] = only_iter["other"]
    with pytest.raises(ConfigError, match="no request-level profile"):
        profile_for("naive", only_iter)


def test_the_interval_reads_the_fits_error_from_the_profile(tmp_path):
    path = tmp_path / "p.json"
    load_cost("toy").to_json(path, level="iteration", fit_rms_rel_error=0.07)
    assert load_profiles([str(path)])["iteration"].sigma == 0.07
    assert load_profiles([toy_profile(tmp_path)])["any"].sigma == 0.0      # a preset: no fit, no model spread
    assert sim_cost(load_config(None, []), load_cost("toy"), 1.1).decode_s_per_row == pytest.approx(
        1.1 * load_cost("toy").decode_s_per_row)


def test_the_real_runs_memory_budget_carries_over():
    cfg = load_config(None, ["backend.kind=hf", "backend.memory_budget_bytes=4096"])
    assert sim_cost(cfg, load_cost("toy")).kv_budget_bytes == 4096


def test_cli_missing_profile_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend: {kind: sim}\n")
    res = CliRunner().invoke(validate_cmd, [str(cfg), "--profile", str(tmp_path / "none.json")])
    assert res.exit_code == 2 and "not found" in res.output and len(res.output.strip().splitlines()) == 1


def test_validation_on_ray_gives_the_local_table(tmp_path, ray_local):
    profile = toy_profile(tmp_path, scale=1.3)
    here = validate(load_config(None, BASE), [profile], tmp_path / "here")
    there = validate(load_config(None, BASE + ["executor.kind=ray"]), [profile], tmp_path / "there")
    assert here.cells.equals(there.cells)


@pytest.mark.parametrize("torn", ["continuous,re", "continuous,real,12", "strat"])
def test_a_row_torn_by_a_kill_is_cut_off_before_the_kept_csv_is_read_or_appended_to(tmp_path, torn):
    """A kill or a full disk mid-append leaves a last line without its newline: the rerun measures that
    row again, and its new row starts on a line of its own (glued on, the file would no longer parse)."""
    from batchlab.calibrate.validate import whole_rows
    path = tmp_path / "saturation.csv"
    whole = "strategy,side,throughput_tok_s\nnaive,real,10.5\n"
    path.write_text(whole + torn if torn != "strat" else torn)
    done = whole_rows(path, ["strategy", "side", "throughput_tok_s"])
    assert done.to_dict("records") == ([{"strategy": "naive", "side": "real", "throughput_tok_s": 10.5}] if torn != "strat" else [])
    pd.DataFrame([{"strategy": "continuous", "side": "real", "throughput_tok_s": 12.0}]).to_csv(
        path, mode="a", header=not path.is_file(), index=False)
    assert pd.read_csv(path)["strategy"].tolist() == (["naive", "continuous"] if torn != "strat" else ["continuous"])


def test_a_server_profile_that_timed_the_drift_probe_is_the_drift_baseline_not_the_fits_prediction(tmp_path):
    """Against the twin's prediction, the fit's error at the probe's one shape reads as a faster or
    slower machine; against the probe as timed when the server was profiled, only the machine moves."""
    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.validate import SERVER, Profile, drift_factors
    ref = tmp_path / "reference.csv"
    pd.DataFrame([{"when": w, "level": SERVER, "seconds": s} for w, s in
                  (("before", 1.1), ("between", 1.2), ("after", 1.3))]).to_csv(ref, index=False)
    prof = Profile("p.json", load_cost("toy"), 0.1, twin=TOY_TWIN, reference_s=1.0)
    d = drift_factors(ref, {SERVER: prof}, ["server"], against="profile")[SERVER]
    assert d.factor == pytest.approx(1.2) and d.against == "profile time"
    # the other baseline recorded beside: where the two part, the profile's timing stood apart from its fit
    pred = drift_factors(ref, {SERVER: prof}, ["server"], against="prediction")[SERVER]
    assert d.vs_prediction == pytest.approx(pred.factor) and pred.vs_prediction is None


def test_drift_against_the_prediction_divides_by_the_profiles_replay_even_where_it_timed_the_probe(tmp_path):
    """validation.drift_against: prediction: a slow moment at the one timing the profile took does
    not become every validation's baseline; the replay of the burst on the fitted steps is."""
    from batchlab.backends.presets import load_cost
    from batchlab.backends.simulated import SimulatedBackend
    from batchlab.calibrate.validate import Profile, burst_seconds, drift_factors
    ref = tmp_path / "reference.csv"
    pd.DataFrame([{"when": w, "level": "iteration", "seconds": s} for w, s in
                  (("before", 1.1), ("between", 1.2), ("after", 1.3))]).to_csv(ref, index=False)
    prof = Profile("p.json", load_cost("toy"), 0.1, twin=None, reference_s=1.0)
    predicted = burst_seconds(SimulatedBackend(prof.cost), "iteration", prof=prof)
    d = drift_factors(ref, {"any": prof}, ["continuous"], against="prediction")["iteration"]
    assert predicted != pytest.approx(1.0)
    assert d.factor == pytest.approx(1.2 / predicted) and d.against == "prediction"
    assert drift_factors(ref, {"any": prof}, ["continuous"], against="profile")["iteration"].factor == pytest.approx(1.2)
    with pytest.raises(ConfigError, match="drift_against"):
        load_config(None, BASE + ["validation.drift_against=sometimes"])


def test_the_live_factor_from_the_other_workloads_absorbs_a_bias_the_drift_probe_misses(tmp_path):
    import json
    # Drift off: nothing tells the replays that the profile reads every step 1.3x slow but the cells
    # of the other workloads, whose real p50 TPOT sits at 1/1.3 of the replays'
    three = BASE + ["strategies=[continuous]", "validation.drift=false",
                    "validation.workloads={bursty: {arrival: gamma, burstiness: 0.25}, long: {prompt_len: 200}}"]
    v = validate(load_config(None, three), [toy_profile(tmp_path, scale=1.3)], tmp_path / "v")
    acc = json.loads((tmp_path / "v" / "accuracy.json").read_text())
    per = acc["live"]["per_workload"]
    assert set(per) == {"base", "bursty", "long"}
    for w in per:        # each from the two others' 2 rates x 2 runs (bursty's batches, and so its TPOT, move a little)
        assert per[w]["iteration"]["factor"] == pytest.approx(1 / 1.3, rel=0.06) and per[w]["iteration"]["cells"] == 8
    tpot = v.cells[v.cells["metric"] == "tpot_p50"]["error"].abs()
    assert tpot.max() < 0.06 and tpot.median() < 0.01      # from +30 % (above) everywhere
    assert v.cells[v.cells["kind"] == "saturation"]["error"].abs().max() < 0.06
    # the profile again, with the factor pooled over every workload: simulating it reproduces the machine
    pooled = acc["live"]["pooled"]["iteration"]
    written = json.loads(open(pooled["profile"]).read())
    assert written["decode_s_per_row"] == pytest.approx(load_cost("toy").decode_s_per_row, rel=0.02)
    assert written["live_factor"]["cells"] == 12
    # off, or with nothing to measure it on (one workload), the bias stays
    off = validate(load_config(None, three + ["validation.live=false"]), [toy_profile(tmp_path, scale=1.3)], tmp_path / "off")
    off_tpot = off.cells[off.cells["metric"] == "tpot_p50"]["error"]
    assert off_tpot.median() == pytest.approx(0.30, abs=0.01) and off_tpot.min() > 0.29
    one = validate(load_config(None, BASE + ["strategies=[continuous]", "validation.drift=false"]),
                   [toy_profile(tmp_path, scale=1.3)], tmp_path / "one")
    assert one.cells[one.cells["metric"] == "tpot_p50"]["error"].to_numpy() == pytest.approx(0.30, abs=0.01)
    # ...though its own cells still measure a factor for later runs (they are not judged with it)
    one_acc = json.loads((tmp_path / "one" / "accuracy.json").read_text())
    one_live = one_acc["live"]
    assert one_live["per_workload"]["base"]["iteration"]["cells"] == 0
    # the default intervals read their width off the other workloads; with none, off the step costs
    assert (acc["interval"], one_acc["interval"]) == (INTERVAL["held-out"], INTERVAL["step-cost"])
    assert one_live["pooled"]["iteration"]["factor"] == pytest.approx(1 / 1.3, rel=0.02)


def test_the_first_token_factor_from_the_other_workloads_absorbs_a_prompt_pass_the_profile_misreads(tmp_path):
    import json
    # The profile reads every prompt token twice as slow as the machine and every decode step right:
    # TPOT is right (the live factor stays near 1), TTFT is far above the real run, and only the
    # other workloads' TTFT cells can say by how much
    slow_prefill = tmp_path / "prefill.json"
    toy = load_cost("toy")
    replace(toy, prefill_s_per_token=2 * toy.prefill_s_per_token).to_json(slow_prefill, level="any")
    three = BASE + ["strategies=[continuous]", "validation.drift=false",
                    "validation.workloads={bursty: {arrival: gamma, burstiness: 0.25}, long: {prompt_len: 200}}"]
    v = validate(load_config(None, three + ["validation.first_token=factor"]), [str(slow_prefill)], tmp_path / "v")
    acc = json.loads((tmp_path / "v" / "accuracy.json").read_text())
    assert acc["live"]["first_token"]["form"] == "factor"
    for w, per in acc["live"]["first_token"]["per_workload"].items():    # two others' 2 rates x 2 runs each
        assert per["iteration"]["factor"] == pytest.approx(0.5, rel=0.06) and per["iteration"]["cells"] == 8, w
    ttft = v.cells[v.cells["metric"] == "ttft_p50"]["error"]
    assert ttft.abs().median() < 0.05 and ttft.abs().max() < 0.1
    pooled = acc["live"]["pooled"]["iteration"]["first_token"]
    assert pooled["factor"] == pytest.approx(0.5, rel=0.02) and pooled["cells"] == 12
    written = json.loads(open(acc["live"]["pooled"]["iteration"]["profile"]).read())
    assert written["prefill_s_per_token"] == pytest.approx(toy.prefill_s_per_token, rel=0.02)
    # off, the prompt pass stays twice as slow: TTFT far above in every cell
    off = validate(load_config(None, three + ["validation.first_token=false"]), [str(slow_prefill)], tmp_path / "off")
    assert off.cells[off.cells["metric"] == "ttft_p50"]["error"].min() > 0.5


def test_the_first_token_delay_finds_a_front_end_the_profile_missed_where_a_factor_cannot(tmp_path):
    import json
    # The real backend's front end holds every request 30 ms before its scheduler sees it; the
    # profile has no front end. A delay from the other workloads' TTFT puts it back for every
    # workload alike; a factor on the first-token terms can only stretch the prompt pass, which is
    # small for short prompts and large for long ones, so no one factor fits every workload
    real = tmp_path / "real.json"
    replace(load_cost("toy"), frontend_s=0.030).to_json(real, level="any")
    three = [f"backend.profile={real}", *BASE[1:], "strategies=[continuous]", "validation.drift=false",
             "validation.workloads={bursty: {arrival: gamma, burstiness: 0.25}, long: {prompt_len: 400}}"]
    profile = toy_profile(tmp_path)
    v = validate(load_config(None, three), [profile], tmp_path / "delay")
    acc = json.loads((tmp_path / "delay" / "accuracy.json").read_text())
    assert acc["live"]["first_token"]["form"] == "delay"
    for w, per in acc["live"]["first_token"]["per_workload"].items():
        assert per["iteration"]["seconds"] == pytest.approx(0.030, rel=0.1) and per["iteration"]["cells"] == 8, w
    delay_ttft = by_cell(v, "ttft_p50")["error"]
    assert delay_ttft.abs().max() < 0.05
    written = json.loads(open(acc["live"]["pooled"]["iteration"]["profile"]).read())
    assert written["first_token_s"] == pytest.approx(0.030, rel=0.1) and written["first_token_delay"]["cells"] == 12
    factor = validate(load_config(None, three + ["validation.first_token=factor"]), [profile], tmp_path / "factor")
    factor_ttft = by_cell(factor, "ttft_p50")["error"]
    assert factor_ttft.abs().max() > 2 * delay_ttft.abs().max()
    assert factor_ttft.loc["long"].abs().min() > 0.1          # long prompts: their pass stretched far past 30 ms


def test_a_finished_validation_keeps_its_config_and_rejudges_to_the_same_cells(tmp_path):
    cfg = load_config(None, BASE + ["strategies=[continuous]", "validation.workloads={long: {prompt_len: 200}}"])
    profile = toy_profile(tmp_path, scale=1.2)
    first = validate(cfg, [profile], tmp_path / "v")
    kept = load_config(str(tmp_path / "v" / "validate.yaml"))
    assert kept.validation == cfg.validation and kept.traffic == cfg.traffic
    kept_runs = sorted((tmp_path / "v").glob("*/*/*.csv")) + sorted((tmp_path / "v").glob("*/*.csv"))
    stamps = {p: p.stat().st_mtime_ns for p in kept_runs}
    again = validate(kept, [profile], tmp_path / "v")
    pd.testing.assert_frame_equal(again.cells, first.cells)
    assert len(stamps) >= 8 and {p: p.stat().st_mtime_ns for p in kept_runs} == stamps   # nothing measured again


def test_the_cli_says_what_the_live_factor_did_or_why_it_could_not():
    from batchlab.calibrate.validate import live_lines
    none = {"per_workload": {"base": {"iteration": {"factor": 1.0, "se": 0.0, "cells": 0}}}, "pooled": {}}
    assert live_lines(none, True) == ["live factor: not measured (it needs a second workload: add one under "
                                      "validation.workloads)"]
    assert live_lines(none, False) == []
    rec = {"per_workload": {"base": {"iteration": {"factor": 1.12, "se": 0.03, "cells": 8}},
                            "long": {"iteration": {"factor": 1.08, "se": 0.02, "cells": 8}}},
           "pooled": {"iteration": {"factor": 1.1, "se": 0.02, "cells": 16, "profile": "out/live_p.json"}}}
    lines = live_lines(rec, True)
    assert lines[0] == ("live factor (base, from the other workloads' p50 TPOT): iteration 1.12x (+-3%, 8 cells); "
                        "its replays were scaled by it")
    assert lines[-1] == "live factor (iteration, every workload): 1.10x; profile with it: out/live_p.json"
    rec["first_token"] = {"per_workload": {"base": {"iteration": {"factor": 0.9, "se": 0.04, "cells": 6}}}}
    rec["pooled"]["iteration"]["first_token"] = {"factor": 0.92, "se": 0.03, "cells": 12}
    lines = live_lines(rec, True, "factor")
    assert ("first-token factor (base, from the other workloads' p50 TTFT): iteration 0.90x (+-4%, 6 cells); "
            "its prompt passes and front end were scaled by it") in lines
    assert lines[-1] == ("live factor (iteration, every workload): 1.10x, first-token 0.92x (+-3%); "
                         "profile with it: out/live_p.json")
    assert live_lines({"per_workload": rec["per_workload"]}, True, "factor")[-1] == (
        "first-token factor: not measured (it needs a second workload: add one under validation.workloads)")
    rec["first_token"] = {"form": "delay",
                          "per_workload": {"base": {"iteration": {"seconds": 0.0041, "se": 0.0006, "cells": 6}}}}
    rec["pooled"]["iteration"]["first_token"] = {"seconds": 0.0038, "se": 0.0004, "cells": 12}
    lines = live_lines(rec, True, "delay")
    assert ("first-token delay (base, from the other workloads' p50 TTFT): iteration 4.1 ms (+-0.6 ms, 6 cells); "
            "each request waited it before the scheduler") in lines
    assert lines[-1] == ("live factor (iteration, every workload): 1.10x, first-token 3.8 ms (+-0.4 ms); "
                         "profile with it: out/live_p.json")
    assert not any("first-token" in line for line in live_lines(rec, True, "off")[:-1])


def test_the_cli_says_which_corrections_the_gate_left_out():
    from batchlab.calibrate.validate import live_lines
    rec = {"per_workload": {"base": {"iteration": {"factor": 1.01, "se": 0.02, "cells": 8, "applied": False}},
                            "long": {"iteration": {"factor": 1.20, "se": 0.02, "cells": 8, "applied": True},
                                     "continuous": {"factor": 1.02, "se": 0.02, "cells": 8, "applied": False}}},
           "pooled": {"iteration": {"factor": 1.01, "se": 0.02, "cells": 16, "applied": False, "profile": "out/live_p.json",
                                    "first_token": {"seconds": 0.004, "se": 0.0005, "cells": 12, "applied": True}}}}
    lines = live_lines(rec, True)
    assert lines[0] == ("live factor (base, from the other workloads' p50 TPOT): iteration 1.01x (+-2%, 8 cells); "
                        "not applied: within validation.gate standard errors of none")
    # one level applied, one not: each level says so and the row says what the applied one did
    assert lines[1] == ("live factor (long, from the other workloads' p50 TPOT): iteration 1.20x (+-2%, 8 cells), "
                        "continuous 1.02x (+-2%, 8 cells) (not applied: within validation.gate of none); "
                        "its replays were scaled by it")
    assert lines[-1] == ("live factor (iteration, every workload): 1.01x (not applied: within validation.gate of none), "
                         "first-token 4.0 ms (+-0.5 ms); profile with it: out/live_p.json")


def test_the_drift_factors_uncertainty_is_its_medians_standard_error_not_one_bursts_spread(tmp_path):
    """One run's own departure from the machine's speed is the interval's run term; the step costs
    carry only how well the median of the n reference bursts knows that speed."""
    import math

    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.validate import SERVER, Profile, drift_factors
    ref = tmp_path / "reference.csv"
    pd.DataFrame([{"when": w, "level": SERVER, "seconds": s} for w, s in
                  (("before", 1.0), ("between", 1.2), ("after", 1.4))]).to_csv(ref, index=False)
    prof = Profile("p.json", load_cost("toy"), 0.05, twin=TOY_TWIN, reference_s=1.0)
    d = drift_factors(ref, {SERVER: prof}, ["server"], against="profile")[SERVER]
    assert d.timings == 3 and d.spread == pytest.approx(0.2 / 1.2)
    drift_se = d.spread * math.sqrt(math.pi / 2) / math.sqrt(3)
    assert d.sigma(prof) == pytest.approx(math.hypot(0.05, drift_se))
    assert d.sigma(prof) < math.hypot(0.05, d.spread)                   # narrower than one burst's spread
    lo, hi = d.side(prof, -1.0)[0], d.side(prof, 1.0)[0]
    assert (hi - lo) / 2 == pytest.approx(d.scale * d.sigma(prof))


def test_a_drift_factor_the_probes_spread_cannot_tell_from_one_is_not_applied_but_still_widens_the_interval(tmp_path):
    import math

    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.validate import SERVER, Profile, drift_factors
    ref = tmp_path / "reference.csv"
    pd.DataFrame([{"when": w, "level": SERVER, "seconds": s} for w, s in
                  (("before", 1.0), ("between", 1.2), ("after", 1.4))]).to_csv(ref, index=False)
    prof = Profile("p.json", load_cost("toy"), 0.05, twin=TOY_TWIN, reference_s=1.0)
    d = drift_factors(ref, {SERVER: prof}, ["server"], against="profile")[SERVER]
    assert math.log(d.factor) / d.se == pytest.approx(1.51, abs=0.01)      # 1.2 from three timings 0.2 apart
    assert d.gated(1.5) is d and d.gated(0.0) is d
    off = d.gated(2.0)
    assert off.factor == 1.0 and off.scale == 1.0
    assert off.sigma(prof) == pytest.approx(d.sigma(prof))                 # its uncertainty still in the interval


def test_mirrored_order_runs_every_first_run_then_the_reruns_backwards_and_judges_the_same(tmp_path, monkeypatch):
    """mirrored moves when each run happens, not what it measures: on the deterministic toy the
    cells are those of the workload-by-workload order."""
    import batchlab.calibrate.validate as val
    sets = BASE + ["strategies=[continuous]", "validation.workloads={bursty: {arrival: gamma, burstiness: 0.25}, "
                                              "long: {prompt_len: 200}}"]
    runs, sweep = [], val._sweep

    def recorded(wc, path, real, say):
        runs.append(f"{path.parent.name}/{path.name}")
        return sweep(wc, path, real, say)

    monkeypatch.setattr(val, "_sweep", recorded)
    mirrored = validate(load_config(None, sets + ["validation.order=mirrored"]), [toy_profile(tmp_path)], tmp_path / "m")
    assert runs == ["base/real", "bursty/real", "long/real",           # every first run in turn
                    "long/real", "long/rerun", "bursty/real", "bursty/rerun", "base/real", "base/rerun"]   # kept ones resumed
    refs = pd.read_csv(tmp_path / "m" / "base" / "reference.csv")
    assert list(refs["when"]) == ["before", "between", "after"]         # each timed once, resumed or not
    assert list(dict.fromkeys(mirrored.cells["workload"])) == ["base", "bursty", "long"]
    runs.clear()
    plain = validate(load_config(None, sets), [toy_profile(tmp_path)], tmp_path / "w")
    assert runs == ["base/real", "base/rerun", "bursty/real", "bursty/rerun", "long/real", "long/rerun"]
    pd.testing.assert_frame_equal(mirrored.cells.reset_index(drop=True), plain.cells.reset_index(drop=True))
    assert "order: mirrored" in (tmp_path / "m" / "validate.yaml").read_text()


def test_an_unknown_order_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError, match="order"):
        load_config(None, BASE + ["validation.order=shuffled"])


def test_counted_over_workloads_the_corrections_keep_their_factors_and_widen_their_standard_errors(tmp_path):
    import json
    three = BASE + ["strategies=[continuous]", "validation.drift=false",
                    "validation.workloads={bursty: {arrival: gamma, burstiness: 0.25}, long: {prompt_len: 200}}"]
    read = lambda: json.loads((tmp_path / "v" / "accuracy.json").read_text())["live"]   # noqa: E731
    validate(load_config(None, three + ["validation.se_units=cells"]), [toy_profile(tmp_path, scale=1.3)], tmp_path / "v")
    cells = read()
    # the same kept real runs judged again (nothing real is run twice), at the default: over workloads
    validate(load_config(None, three), [toy_profile(tmp_path, scale=1.3)], tmp_path / "v")
    units = read()
    assert (cells["se_units"], units["se_units"]) == ("cells", "workloads")
    for w, per in units["per_workload"].items():
        one, other = per["iteration"], cells["per_workload"][w]["iteration"]
        assert one["factor"] == pytest.approx(other["factor"]) and one["se"] >= other["se"] and one["cells"] == other["cells"]
    assert units["pooled"]["iteration"]["se"] >= cells["pooled"]["iteration"]["se"]


def test_the_cli_says_what_the_replays_did_with_the_drift_probe():
    from batchlab.calibrate.validate import _drift_use
    assert _drift_use("measure", [False, False]) == "; recorded, not applied (validation.drift: measure)"
    assert _drift_use("apply", [True, True]) == "; the replays were scaled by it"
    assert _drift_use("apply", [True, False]) == "; applied where it passed the gate only"


def test_validates_drift_line_gives_the_factor_against_the_fits_prediction_beside_the_profiles_timing():
    from batchlab.calibrate.validate import _against
    assert _against({"against": "profile time", "vs_prediction": 0.974}) == (
        "as timed on the server when profiled; 0.97x as its fit predicts it")
    assert _against({"against": "profile time"}) == "as timed on the server when profiled"   # a record made before
    assert _against({"against": "prediction"}) == "as its fit predicts it"
