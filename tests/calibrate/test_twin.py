"""The twin's limits: each from the most direct source there is, and said so; and decode rows past
the profile's largest batch priced at its top batches' growth."""
import pytest

from batchlab.calibrate.twin import VLLM_DEFAULTS, limits
from batchlab.errors import ConfigError
from batchlab.run.config import load_config


def cfg(*sets):
    return load_config(None, ["backend.kind=openai", "backend.base_url=http://x/v1", "backend.model=m", "strategies=[server]", *sets])


def values(found):
    return {k: (v.value, v.source) for k, v in found.items()}


def test_a_server_that_says_nothing_keeps_the_config_section():
    got = values(limits(cfg("continuous.max_num_seqs=7"), {}, None))
    assert got["max_num_seqs"] == (7, "config") and got["chunk_size"] == (None, "config")


def test_a_vllm_that_publishes_only_its_cache_gets_vllm_defaults_said_to_be_assumed():
    got = values(limits(cfg(), {"num_gpu_blocks": "4096", "block_size": "128", "enable_prefix_caching": "True"}, None))
    assert got["max_num_seqs"] == (VLLM_DEFAULTS["max_num_seqs"], "vLLM default")
    assert got["chunk_size"][1].startswith("vLLM default") and got["num_kv_blocks"] == (4096, "server /metrics")
    assert got["block_size"] == (128, "server /metrics")


def test_what_the_server_states_beats_what_it_was_asked_for_which_beats_the_defaults():
    record = {"server": "vllm", "asked": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "chunked_prefill": True},
              "runs_with": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "chunk_size": 256}}
    got = values(limits(cfg(), {}, record))
    assert got["max_num_seqs"] == (8, "runs with") and got["chunk_size"] == (256, "runs with")
    got = values(limits(cfg(), {}, record, stated={"max_num_seqs": 9}))
    assert got["max_num_seqs"] == (9, "server /server_info")


def test_chunked_prefill_turned_off_when_started_is_no_chunking():
    got = values(limits(cfg(), {}, {"server": "vllm", "asked": {"chunked_prefill": False}}))
    assert got["chunk_size"] == (None, "started with")


def test_the_device_a_server_states_decides_where_its_front_end_runs():
    from batchlab.backends.openai_client import parse_server_config
    from batchlab.calibrate.twin import on_engine
    assert parse_server_config({"device_config": {"device": "cpu"}}) == {"device": "cpu"}
    found = limits(cfg(), {}, None, stated=parse_server_config({"device_config": {"device": "cpu"}}))
    assert values(found)["device"] == ("cpu", "server /server_info") and on_engine(found)
    assert not on_engine(limits(cfg(), {}, None)) and not on_engine(limits(cfg(), {}, None, stated={"device": "cuda"}))


def test_a_batchlab_server_that_states_its_limits_gets_them_and_no_vllm_default():
    stated = {"server": "batchlab", "device": "cpu", "max_num_seqs": 12, "max_num_batched_tokens": 2048,
              "block_size": 16, "num_kv_blocks": 1024, "chunk_size": None, "prefix_caching": False}
    got = values(limits(cfg(), {}, None, stated=stated))
    assert {k: v for k, (v, source) in got.items() if source == "server /server_info"} == {
        k: v for k, v in stated.items() if k != "server"}
    assert not any(source.startswith("vLLM") for _, source in got.values())


def _bent_profile(per_row_s: float) -> dict:
    """The toy preset's record, its decode steps on its own lines up to 16 rows and `per_row_s` a
    row more for every row past 16 at 32 (a batch that grows faster at the top than the lines)."""
    import json
    import tempfile
    from pathlib import Path

    from batchlab.backends.presets import load_cost
    toy = load_cost("toy")
    rows = [{"context_tokens": b * (16 + k), "prefill_tokens": 0, "decode_rows": b, "kind": "decode",
             "seconds": toy.step_time(b * (16 + k), 0, b) + per_row_s * max(0, b - 16)}
            for b in (1, 2, 4, 8, 16, 32) for k in (2, 6, 10, 14)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "profile.json"
        toy.to_json(path, level="iteration", samples=rows)
        return json.loads(path.read_text())


@pytest.mark.parametrize("per_row_s", [0.0, 3e-5, -1e-5])
def test_rows_past_a_profile_grow_as_its_top_two_batches_grew_beyond_the_lines(per_row_s):
    from batchlab.backends.cost import StepCost
    from batchlab.calibrate.twin import beyond_the_profile
    record = beyond_the_profile(_bent_profile(per_row_s))
    assert record["rows_profiled"] == 32 and record["beyond_s_per_row"] == pytest.approx(per_row_s, abs=1e-12)
    cost, lines = StepCost.from_record(record), StepCost.from_record(_bent_profile(per_row_s))
    assert cost.step_time(128 * 20, 0, 128) - lines.step_time(128 * 20, 0, 128) == pytest.approx(96 * per_row_s, abs=1e-12)


def test_rows_past_a_small_fit_are_priced_from_the_bigger_steps_and_leave_the_small_ones_as_fitted():
    """The toy's record as the fit on at most 16 rows, the steps of 32, 64 and 128 rows each 2 ms
    a row past 16 dearer: the slope comes back, the steps up to 16 rows are priced as before."""
    from batchlab.backends.cost import StepCost
    from batchlab.calibrate.fit import samples_from
    from batchlab.calibrate.twin import rows_past
    small = _bent_profile(0.0)
    toy = StepCost.from_record(small)
    big = [{"context_tokens": b * 40, "prefill_tokens": 0, "decode_rows": b, "kind": "decode",
            "seconds": toy.step_time(b * 40, 0, b) + 0.002 * (b - 16)} for b in (32, 64, 128)]
    mine = [s for s in small["samples"] if s["decode_rows"] <= 16]
    record = rows_past(small, samples_from(mine + big), 16)
    assert record["rows_profiled"] == 16 and record["beyond_s_per_row"] == pytest.approx(0.002)
    priced = StepCost.from_record(record)
    assert priced.step_time(16 * 20, 0, 16) == toy.step_time(16 * 20, 0, 16)
    assert priced.step_time(128 * 40, 0, 128) == pytest.approx(toy.step_time(128 * 40, 0, 128) + 0.002 * 112)
    with pytest.raises(ConfigError, match="no decode step of more than 128 rows"):
        rows_past(small, samples_from(mine + big), 128)


def test_a_profile_of_one_batch_size_has_nothing_to_carry_past_it():
    from batchlab.calibrate.twin import beyond_the_profile
    record = _bent_profile(0.0)
    record["samples"] = [s for s in record["samples"] if s["decode_rows"] == 32]
    with pytest.raises(ConfigError, match="fewer than two batch sizes"):
        beyond_the_profile(record)
