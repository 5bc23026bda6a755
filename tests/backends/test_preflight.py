"""preflight(cfg): everything a run reads is checked before anything is written (simulator and
input files here; the HF model checks are in test_hf.py, the server checks in test_openai.py)."""
from __future__ import annotations

import json

import pytest

from batchlab.errors import ConfigError
from batchlab.run.config import load_user_config
from batchlab.run.sweep import preflight


def test_the_default_sweep_passes_with_no_warnings():
    assert preflight(load_user_config(None, [])) == []


def test_warnings_name_the_keys_the_backend_ignores():
    assert preflight(load_user_config(None, ["backend.model=llama-7b"])) == [
        "backend.model does not apply to backend.kind 'sim' (ignored)"]


@pytest.mark.parametrize("profile,message", [
    (None, "not found"),
    ("{not json", "not a batchlab profile"),
    ('{"overhead_s": NaN, "weight_s": 0.01, "kv_s_per_token": 0, "prefill_s_per_token": 0, "decode_s_per_row": 0,'
     ' "kv_bytes_per_token": 1, "kv_budget_bytes": 100}', "overhead_s must be a finite number >= 0 (got nan)"),
    ('{"overhead_s": 0.001, "weight_s": "fast", "kv_s_per_token": 0, "prefill_s_per_token": 0, "decode_s_per_row": 0,'
     ' "kv_bytes_per_token": 1, "kv_budget_bytes": 100}', "weight_s must be a finite number >= 0 (got 'fast')"),
    ('{"overhead_s": 0.001, "weight_s": 0.01, "kv_s_per_token": 0, "prefill_s_per_token": 0, "decode_s_per_row": 0,'
     ' "kv_bytes_per_token": 0, "kv_budget_bytes": 100}', "kv_bytes_per_token must be > 0"),
])
def test_a_bad_profile_is_one_line(tmp_path, profile, message):
    f = tmp_path / "profile.json"
    if profile is not None:
        f.write_text(profile)
    with pytest.raises(ConfigError) as e:
        preflight(load_user_config(None, [f"backend.profile={f}"]))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_preset_trace_or_sharegpt_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'h100'"):
        preflight(load_user_config(None, ["backend.preset=h100"]))
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0.1,10,5\nnan,10,5\n")
    with pytest.raises(ConfigError, match=r"t.csv:3: arrival_time must be"):
        preflight(load_user_config(None, ["traffic.arrival=trace", f"traffic.trace_file={trace}"]))
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ConfigError, match="expected a JSON list of conversations"):
        preflight(load_user_config(None, [f"traffic.prompt_len={{dist: sharegpt, path: {sg}}}"]))
