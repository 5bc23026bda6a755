
import pytest
from click.testing import CliRunner

from batchlab.backends.presets import load_cost
from batchlab.calibrate.validate import load_profiles, profile_for, report_lines, sim_cost, validate, validate_cmd
from batchlab.core.config import load_config
from batchlab.errors import ConfigError


def toy_profile(tmp_path, level="any", name="toy.json"):
    path = tmp_path / name
    load_cost("toy").to_json(path, level=level)
    return str(path)


def test_simulator_validated_against_itself_has_zero_error(tmp_path):
    cfg = load_config(None, ["backend.preset=toy", "traffic.rates=[5,20]", "traffic.duration_s=8",
                             "traffic.warmup_s=1", "traffic.prompt_len=32", "traffic.output_len=16"])
    table = validate(cfg, [toy_profile(tmp_path)], tmp_path / "v")
    assert len(table) == 6
    for m in ("ttft_p50", "ttft_p99", "tpot_p50", "throughput_tok_s"):
        assert table[f"{m}_err"].abs().max() == 0.0
    assert (tmp_path / "v" / "validation.csv").is_file() and (tmp_path / "v" / "real" / "summary.csv").is_file()
    assert "max |error|" in report_lines(table)[-1]


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
