from dataclasses import replace

import pytest
from click.testing import CliRunner

from batchlab.backends.presets import load_cost
from batchlab.calibrate.validate import load_profiles, profile_for, report_lines, sim_cost, validate, validate_cmd
from batchlab.core.config import load_config
from batchlab.errors import ConfigError

TIME_FIELDS = ("overhead_s", "weight_s", "kv_s_per_token", "prefill_s_per_token", "decode_s_per_row", "prefill_step_s")


def toy_profile(tmp_path, level="any", name="toy.json", scale=1.0):
    """The toy preset as a profile; `scale` multiplies every step-time term (a miscalibration)."""
    path = tmp_path / name
    toy = load_cost("toy")
    replace(toy, **{k: scale * getattr(toy, k) for k in TIME_FIELDS}).to_json(path, level=level)
    return str(path)


def test_validation_detects_step_times_that_are_30_percent_too_slow(tmp_path):
    # The "real" run is the toy preset; the profile claims every step costs 1.3x as much.
    cfg = load_config(None, ["backend.preset=toy", "traffic.rates=[5,20]", "traffic.duration_s=8",
                             "traffic.warmup_s=1", "traffic.prompt_len=32", "traffic.output_len=16"])
    table = validate(cfg, [toy_profile(tmp_path, scale=1.3)], tmp_path / "v").set_index(["strategy", "rate"])
    assert len(table) == 6
    # TPOT is step time alone: +30% everywhere
    assert table["tpot_p50_err"].to_numpy() == pytest.approx(0.30, abs=0.01)
    # continuous TTFT is one prefill step at light load: +30%; request-level TTFT is mostly the
    # wait for a batch to fill, which the step time barely moves
    assert table.loc[("continuous", 5.0), "ttft_p50_err"] == pytest.approx(0.30, abs=0.01)
    assert abs(table.loc[("naive", 5.0), "ttft_p50_err"]) < 0.05
    # below capacity throughput follows the arrivals, so it hides the error: why TPOT is checked
    assert table["throughput_tok_s_err"].abs().max() < 0.01
    assert "tpot_p50 30.0%" in report_lines(table.reset_index())[-1]
    assert (tmp_path / "v" / "validation.csv").is_file() and (tmp_path / "v" / "real" / "summary.csv").is_file()
    # secondary: the exact profile reproduces the run (the simulator is deterministic)
    exact = validate(cfg, [toy_profile(tmp_path, name="exact.json")], tmp_path / "e")
    assert exact["tpot_p50_err"].abs().max() == 0.0


def test_profiles_are_matched_to_each_strategys_path(tmp_path):
    profiles = load_profiles([toy_profile(tmp_path, "request", "r.json"), toy_profile(tmp_path, "iteration", "i.json")])
    assert profile_for("dynamic", profiles)[0].endswith("r.json")
    assert profile_for("continuous", profiles)[0].endswith("i.json")
    only_iter = load_profiles([toy_profile(tmp_path, "iteration", "i.json"), toy_profile(tmp_path, "iteration", "j.json")])
    only_iter["other"] = only_iter.pop("iteration")
    only_iter["iteration"] = only_iter["other"]
    with pytest.raises(ConfigError, match="no request-level profile"):
        profile_for("naive", only_iter)


def test_the_real_runs_memory_budget_carries_over():
    cfg = load_config(None, ["backend.memory_budget_bytes=4096"])
    assert sim_cost(cfg, load_cost("toy")).kv_budget_bytes == 4096


def test_cli_missing_profile_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend: {kind: sim}\n")
    res = CliRunner().invoke(validate_cmd, [str(cfg), "--profile", str(tmp_path / "none.json")])
    assert res.exit_code == 2 and "not found" in res.output and len(res.output.strip().splitlines()) == 1


def test_validation_on_ray_gives_the_local_table(tmp_path, ray_local):
    base = ["backend.preset=toy", "traffic.rates=[5,20]", "traffic.duration_s=8", "traffic.warmup_s=1",
            "traffic.prompt_len=32", "traffic.output_len=16"]
    profile = toy_profile(tmp_path, scale=1.3)
    here = validate(load_config(None, base), [profile], tmp_path / "here")
    there = validate(load_config(None, base + ["executor.kind=ray"]), [profile], tmp_path / "there")
    cols = [c for c in here.columns if not c.startswith("wall")]
    assert here[cols].equals(there[cols])
