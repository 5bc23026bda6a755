"""The client comparison's pure parts: the trace both clients replay, vLLM's command line and
result file, batchlab's figures under vLLM's definitions, the server's own means. Nothing is timed
and neither vLLM nor a server runs."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from batchlab.baselines import vllm_bench as bench
from batchlab.core.request import Request, Status


def test_the_trace_starts_at_zero_is_seeded_and_keeps_its_lengths():
    trace = bench.make_trace(16, 30, 32, 32, seed=0)
    assert trace[0].arrival == 0.0
    assert [t.arrival for t in trace] == sorted(t.arrival for t in trace)
    assert 400 < len(trace) < 560                                   # about 16 x 30
    assert {(t.prompt_len, t.output_len) for t in trace} == {(32, 32)}
    assert bench.make_trace(16, 30, 32, 32, seed=0) == trace
    assert bench.make_trace(16, 30, 32, 32, seed=1) != trace


@pytest.mark.parametrize("args", [(0, 30, 32, 32), (16, 0, 32, 32), (16, 30, 0, 32), (16, 30, 32, 1)])
def test_bad_trace_settings_are_one_line_errors(args):
    with pytest.raises(ValueError) as e:
        bench.make_trace(*args, seed=0)
    assert "\n" not in str(e.value)


def test_the_timed_trace_rows_carry_the_same_times_and_lengths_and_no_shared_prefix():
    trace = bench.make_trace(16, 5, 40, 32, seed=0)
    rows = bench.timed_trace_rows(trace)
    assert [r["timestamp"] for r in rows] == pytest.approx([t.arrival for t in trace], abs=1e-6)
    assert all(r["input_length"] == 40 and r["output_length"] == 32 for r in rows)
    ids = [h for r in rows for h in r["hash_ids"]]
    assert len(ids) == len(set(ids))                                # every prompt its own
    assert all(len(r["hash_ids"]) == 3 for r in rows)               # ceil(40 / 16): enough tokens for the prompt


def test_vllm_replays_the_file_at_its_own_timestamps_greedily():
    cmd = bench.vllm_command("py", "http://h:1", "tiny", "/tok", Path("/t.jsonl"), 480, Path("/out"), "r.json")
    joined = " ".join(cmd)
    for part in ("bench serve", "--dataset-name timed_trace", "--dataset-path /t.jsonl", "--num-prompts 480",
                 "--temperature 0", "--save-detailed", "--result-filename r.json", "--endpoint /v1/completions"):
        assert part in joined
    assert "--request-rate" not in joined                           # the file's timestamps, not a rate


def vllm_result(starts):
    return {"completed": 3, "failed": 0, "median_ttft_ms": 13.0, "median_tpot_ms": 4.33, "median_e2el_ms": 146.5,
            "median_itl_ms": 4.1, "mean_ttft_ms": 14.0, "mean_tpot_ms": 4.5, "mean_e2el_ms": 150.0,
            "start_times": starts, "output_lens": [32, 32, 32], "itls": [[0.004] * 31] * 3}


def test_vllm_figures_in_seconds_with_its_send_lag_against_the_trace():
    trace = bench.make_trace(16, 1, 32, 32, seed=0)[:3]
    planned = [t.arrival for t in trace]
    starts = [100.0 + planned[0], 100.0 + planned[1] + 0.001, 100.0 + planned[2] + 0.002]
    f = bench.vllm_figures(vllm_result(starts), trace)
    assert f["ttft_p50"] == pytest.approx(0.013) and f["tpot_p50"] == pytest.approx(0.00433)
    assert f["e2e_p50"] == pytest.approx(0.1465) and f["itl_p50"] == pytest.approx(0.0041)
    assert f["send_lag_p50"] == pytest.approx(0.001)
    assert f["output_lens"] == [32] and f["chunks_per_request_p50"] == 32


def test_a_file_that_is_not_a_vllm_result_is_a_one_line_error():
    with pytest.raises(ValueError, match="median_ttft_ms") as e:
        bench.vllm_figures({"completed": 1}, [])
    assert "\n" not in str(e.value)


def finished(rid, arrival, stamps):
    r = Request(rid, 4, len(stamps), arrival)
    r.token_times, r.status = list(stamps), Status.FINISHED
    return r


def test_batchlab_figures_use_vllm_definitions_and_say_where_the_clock_starts():
    reqs = [finished("a", 0.0, [0.010, 0.014, 0.018]), finished("b", 1.0, [1.012, 1.016, 1.020])]
    failed = Request("c", 4, 3, 2.0)
    failed.fail("boom")
    backend = SimpleNamespace(started_at={"a": 0.001, "b": 1.001}, sent_at={"a": 0.002, "b": 1.002},
                              chunk_times={"a": [0.010, 0.014, 0.018], "b": [1.012, 1.016, 1.020]})
    f = bench.batchlab_figures(reqs + [failed], backend)
    assert f["ttft_p50"] == pytest.approx(0.011)                    # from the planned arrival
    assert f["ttft_from_send_p50"] == pytest.approx(0.010)          # from the send start, as vLLM
    assert f["tpot_p50"] == pytest.approx(0.004) and f["itl_p50"] == pytest.approx(0.004)
    assert f["e2e_p50"] == pytest.approx(0.019)
    assert f["send_lag_p50"] == pytest.approx(0.001) and f["pre_send_p50"] == pytest.approx(0.001)
    assert f["completed"] == 2 and f["failed"] == 1


def test_server_means_from_two_scrapes_of_its_histograms():
    text = "\n".join(["# HELP batchlab_ttft_seconds x", "batchlab_ttft_seconds_sum 1.5", "batchlab_ttft_seconds_count 100",
                      'batchlab_ttft_seconds_bucket{le="0.01"} 3', "batchlab_tpot_seconds_sum 0.5",
                      "batchlab_tpot_seconds_count 100", "batchlab_e2e_seconds_sum 15", "batchlab_e2e_seconds_count 100"])
    before = bench.metrics.values(text, [f"batchlab_{n}_seconds_{k}" for n in bench.SERVER_SERIES for k in ("sum", "count")])
    after = {k: v * 2 for k, v in before.items()}
    means = bench.server_means(before, after)
    assert means == pytest.approx({"ttft_mean": 0.015, "tpot_mean": 0.005, "e2e_mean": 0.15})


def test_ratios_and_their_median_against_the_3_percent_target():
    ours = {"ttft_p50": 0.0126, "tpot_p50": 0.00397, "e2e_p50": 0.136, "itl_p50": 0.004}
    theirs = {"ttft_p50": 0.013, "tpot_p50": 0.00433, "e2e_p50": 0.1465, "itl_p50": 0.004}
    r = bench.ratios(ours, theirs)
    assert r["tpot"] == pytest.approx(0.917, abs=1e-3)
    s = bench.summary([{"ratio": r}, {"ratio": {k: 1.0 for k in r}}, {"ratio": {k: 1.01 for k in r}}])
    assert s["median_ratio"]["ttft"] == pytest.approx(1.0)
    assert s["within_3pct"] == {"ttft": True, "tpot": True, "e2e": True}


def test_what_a_client_adds_over_the_server_is_its_mean_minus_the_servers():
    client = {"ttft_mean": 0.016, "tpot_mean": 0.0050, "e2e_mean": 0.170}
    server = {"ttft_mean": 0.012, "tpot_mean": 0.0051, "e2e_mean": 0.165}
    assert bench.over_server(client, server) == pytest.approx({"ttft": 4.0, "tpot": -0.1, "e2e": 5.0})
