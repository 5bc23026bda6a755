"""`batchlab loadtest` against a live `batchlab serve` (simulator, toy preset)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("fastapi")

from batchlab.backends.openai_client import OpenAIBackend  # noqa: E402
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
    assert res.output.count("conc=") == 2 and res.output.count(" e2e_p95=") == 2     # p95 of what, said
    assert [row["concurrency"] for row in json.loads(out.read_text())] == [1, 3]


def test_cli_open_loop_split_over_two_processes_records_every_request_once(tmp_path):
    out = tmp_path / "lt.json"
    with running_server("continuous") as (url, _):
        res = CliRunner().invoke(loadtest_cmd, [url + "/v1", "--rate", "30", "--duration", "1", "--output-len", "4",
                                                "--prompt-len", "4", "--workers", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    [row] = json.loads(out.read_text())
    assert row["loadgen_workers"] == 2 and row["loadgen_restarts"] == 0
    assert row["finished"] == row["num_requests"] > 0


def test_cli_bad_input_is_one_line_and_exit_2():
    res = CliRunner().invoke(loadtest_cmd, ["127.0.0.1:9/v1", "--model", "m"])
    assert res.exit_code == 2 and "must start with http://" in res.output
    res = CliRunner().invoke(loadtest_cmd, ["http://127.0.0.1:9/v1", "--model", "m", "--concurrency", "a,b"])
    assert res.exit_code == 2 and "--concurrency" in res.output


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize("args,message", [
    (["--rate", "inf"], "rates.0: Input should be a finite number"),
    (["--rate", "1e9"], "rates.0: Input should be less than or equal to 100000"),
    (["--rate", "5", "--duration", "nan"], "duration_s: Input should be a finite number"),
    (["--concurrency", "100000"], "--concurrency: levels must be from 1 to 65,536"),
    (["--concurrency", "1000", "--per-user", "5000"], "the limit is 1,000,000"),
    (["--workers", "2"], "--workers: a closed loop is sent by one process"),
    (["--api-key-env", "SURELY_NOT_SET_1234"], "--api-key-env: the environment variable SURELY_NOT_SET_1234 is not set"),
])
def test_cli_bad_numbers_and_keys_are_one_line_before_any_request(args, message, monkeypatch):
    monkeypatch.delenv("SURELY_NOT_SET_1234", raising=False)
    res = CliRunner().invoke(loadtest_cmd, ["http://127.0.0.1:9/v1", "--model", "m", *args])
    assert message in one_error_line(res)


def test_cli_checks_the_model_is_served_and_names_the_served_ones():
    with running_server("continuous") as (url, _):
        res = CliRunner().invoke(loadtest_cmd, [url + "/v1", "--model", "nope", "--concurrency", "1"])
    assert "backend.model 'nope' is not served" in one_error_line(res)
    assert "it serves: toy, local-model" in res.stderr


def test_cli_reads_the_key_from_the_environment_and_writes_it_nowhere(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVER_KEY", "sk-loadtest-secret-77")
    out = tmp_path / "lt.json"
    with running_server("continuous") as (url, _):
        res = CliRunner().invoke(loadtest_cmd, [url + "/v1", "--api-key-env", "MY_SERVER_KEY", "--concurrency", "2",
                                                "--prompt-len", "4", "--output-len", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())[0]["failed"] == 0
    assert "sk-loadtest-secret-77" not in out.read_text() and "sk-loadtest-secret-77" not in res.output
