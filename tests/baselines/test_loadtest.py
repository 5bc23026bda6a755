"""`batchlab loadtest` against a live `batchlab serve` (simulator, toy preset)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("fastapi")

from batchlab.backends.openai import OpenAIBackend  # noqa: E402
from batchlab.baselines.loadtest import closed_loop, loadtest_cmd, open_loop  # noqa: E402
from batchlab.core.config import TrafficConfig  # noqa: E402
from tests.server.conftest import running_server  # noqa: E402


def test_closed_loop_counts_every_request_per_level():
    with running_server("continuous") as (url, _):
        backend = OpenAIBackend(url + "/v1", "toy")
        rows = [closed_loop(backend, c, per_user=2, prompt_len=8, output_len=5) for c in (1, 4)]
    assert [r["requests"] for r in rows] == [2, 8]
    assert all(r["failed"] == 0 and r["requests_per_s"] > 0 and r["e2e_p95"] >= r["e2e_p50"] for r in rows)


def test_open_loop_reports_the_generators_send_lag():
    with running_server("dynamic", ["dynamic.max_wait_ms=2"]) as (url, _):
        backend = OpenAIBackend(url + "/v1", "toy")
        traffic = TrafficConfig(arrival="gamma", burstiness=0.5, duration_s=0.5, warmup_s=0.0, seed=3,
                                prompt_len=8, output_len=4)
        summary, requests = open_loop(backend, traffic, rate=40.0)
    assert summary["num_requests"] == len(requests) > 0
    assert summary["finished"] == len(requests)
    assert 0 <= summary["send_lag_p50"] <= summary["send_lag_p99"] <= summary["send_lag_max"]
    assert requests[0].arrival_time >= 0


def test_cli_closed_loop_prints_one_line_per_level_and_writes_json(tmp_path):
    out = tmp_path / "lt.json"
    with running_server("continuous") as (url, _):
        res = CliRunner().invoke(loadtest_cmd, [url + "/v1", "--concurrency", "1,3", "--output-len", "4",
                                                "--prompt-len", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.count("conc=") == 2
    assert [row["concurrency"] for row in json.loads(out.read_text())] == [1, 3]


def test_cli_bad_input_is_one_line_and_exit_2():
    res = CliRunner().invoke(loadtest_cmd, ["127.0.0.1:9/v1", "--model", "m"])
    assert res.exit_code == 2 and "must start with http://" in res.output
    res = CliRunner().invoke(loadtest_cmd, ["http://127.0.0.1:9/v1", "--model", "m", "--concurrency", "a,b"])
    assert res.exit_code == 2 and "--concurrency" in res.output
