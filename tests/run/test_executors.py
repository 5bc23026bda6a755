"""The sweep on a real local Ray (started once per session, 2 CPUs): the same bytes as the local
executor whatever order points finish in, a worker killed mid-point retried without a lost or
duplicate row, retries that run out reported with the finished points kept, and the resources
that keep points off one device or server."""
import csv
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchlab.cli import main
from batchlab.core.config import ExecutorConfig
from batchlab.errors import ConfigError, RunFailed
from batchlab.run.config import load_config
from batchlab.run.executors import LocalExecutor, Need, RayExecutor, server_resource
from batchlab.run.results import ResultsDir
from batchlab.run.sweep import execute, plan_sweep, point_need, point_task, run_sweep
from tests.conftest import SERVER
from tests.run.test_sweep import assert_same_files

# a prefix cache gives continuous's summary rows columns the others lack: the header must not
# depend on which point came back first
SMALL = ["traffic.rates=[5, 20]", "traffic.duration_s=20", "traffic.warmup_s=2", "report=false",
         "traffic.output_len={dist: uniform, low: 8, high: 64}", "continuous.prefix_caching=true",
         "traffic.prefix={groups: 4, tokens: 64}"]
RAY = ["executor.kind=ray"]



def dies_once(marker_dir: str, victim: tuple):
    """A point task whose worker process dies on the victim's first attempt, after computing its
    rows and before handing them back (the case that could write a point twice)."""
    def task(cfg, key):
        rows = point_task(cfg, key)
        marker = Path(marker_dir) / f"{key[0]}-{key[1]}-{key[2]}"
        if tuple(key) == victim and not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(1)
        return rows
    return task


def always_dies(victim: tuple):
    def task(cfg, key):
        if tuple(key) == victim:
            os._exit(1)
        return point_task(cfg, key)
    return task


def test_a_ray_sweep_writes_the_same_bytes_as_a_local_one(tmp_path, ray_local):
    local = run_sweep(load_config(None, SMALL), tmp_path / "local")
    seen = []
    on_ray = run_sweep(load_config(None, SMALL + RAY), tmp_path / "ray", on_point=lambda p: seen.append(p.summary["strategy"]))
    assert len(seen) == 6
    assert_same_files(local, on_ray)
    placement = (on_ray / "setup.json").read_text()
    assert "ray (" in placement and "each point holds 1 CPU" in placement


def test_a_worker_killed_mid_point_is_retried_and_nothing_is_lost_or_written_twice(tmp_path, ray_local):
    local = run_sweep(load_config(None, SMALL), tmp_path / "local")
    victim = ("dynamic", 20.0, 0)
    plan = plan_sweep(load_config(None, SMALL + RAY), tmp_path / "ray")
    execute(plan, task=dies_once(str(tmp_path), victim))
    assert (tmp_path / "dynamic-20.0-0").is_file()          # the worker really died once
    rows = list(csv.DictReader((tmp_path / "ray" / "requests.csv").open(newline="")))
    per_point = {}
    for r in rows:
        per_point.setdefault((r["strategy"], float(r["rate"])), []).append(r["request_id"])
    assert all(len(ids) == len(set(ids)) for ids in per_point.values())    # no duplicate row
    assert_same_files(local, tmp_path / "ray")                              # and none missing


def test_retries_that_run_out_fail_the_run_and_keep_every_other_point(tmp_path, ray_local):
    victim = ("continuous", 5.0, 0)
    plan = plan_sweep(load_config(None, SMALL + RAY + ["executor.max_retries=1"]), tmp_path / "r")
    with pytest.raises(RunFailed, match=r"continuous @ 5 req/s \(repeat 0\).*died 2 time"):
        execute(plan, task=always_dies(victim))
    done = ResultsDir(tmp_path / "r").done_points()
    assert len(done) == 5 and victim not in done
    run_sweep(load_config(None, SMALL), tmp_path / "r")       # a rerun completes it, canonical bytes
    assert_same_files(run_sweep(load_config(None, SMALL), tmp_path / "local"), tmp_path / "r")


def test_points_against_one_server_never_overlap(ray_local, tmp_path):
    ex = RayExecutor(ExecutorConfig(kind="ray"))
    spans = [f.value for f in ex.map(_stamped_sleep, [(0.2,)] * 3, Need(1, resources=((SERVER, 1.0),)))]
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def _stamped_sleep(s: float) -> tuple[float, float]:
    start = time.time()
    time.sleep(s)
    return start, time.time()


def test_a_cluster_without_the_servers_resource_is_refused(ray_local):
    with pytest.raises(ConfigError, match="has no resource server:10.0.0.9:80"):
        RayExecutor(ExecutorConfig(kind="ray"), {"server:10.0.0.9:80": 1.0})


def test_each_point_asks_for_what_it_holds(ray_local):
    ex = RayExecutor(ExecutorConfig(kind="ray"))
    sim = load_config(None, [])
    assert point_need(sim, ex) == Need(1)
    server = load_config(None, ["backend.kind=openai", "backend.base_url=http://127.0.0.1:8000/v1", "backend.model=m",
                                "strategies=[server]"])
    assert point_need(server, ex) == Need(1, resources=((SERVER, 1.0),))
    assert server_resource("https://api.example.com/v1") == "server:api.example.com:443"
    hf = ["backend.kind=hf", "backend.model=tiny"]
    assert point_need(load_config(None, hf + ["backend.device=cuda"]), ex) == Need(1, num_gpus=1)
    assert point_need(load_config(None, hf + ["backend.device=cpu", "backend.threads=2"]), ex) == Need(2)
    assert point_need(load_config(None, hf + ["backend.device=cpu"]), ex) == Need(2)   # torch's default: every core


def test_run_executor_ray_without_ray_installed_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` raises ImportError
    res = CliRunner().invoke(main, ["run", "--executor", "ray", "--quiet", "--out", str(tmp_path / "r"),
                                    "--set", "traffic.rates=[5]", "--set", "traffic.duration_s=5"])
    assert res.exit_code == 2 and "pip install 'batchlab[ray]'" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


class Backwards(LocalExecutor):
    """Hands results back last point first: the order a cluster may well choose."""
    def map(self, fn, calls, need=Need()):
        return reversed(list(super().map(fn, calls, need)))


def test_points_finishing_in_reverse_order_still_write_canonical_bytes(tmp_path):
    local = run_sweep(load_config(None, SMALL), tmp_path / "local")
    plan = plan_sweep(load_config(None, SMALL), tmp_path / "back")
    plan.executor = Backwards()
    seen = []
    execute(plan, on_point=lambda p: seen.append((p.summary["strategy"], p.summary["rate"])))
    assert seen[0] == ("continuous", 20.0)          # continuous (the one with cache columns) came back first
    assert_same_files(local, tmp_path / "back")


def test_a_ray_address_where_nothing_listens_is_one_line_exit_2_and_writes_nothing(tmp_path):
    """Ray itself retries such an address for many minutes; the executor refuses it at once."""
    pytest.importorskip("ray")
    out = tmp_path / "r"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.run([sys.executable, "-m", "batchlab.cli", "run", "--quiet", "--out", str(out),
                        "--set", "executor.kind=ray", "--set", "executor.address=127.0.0.1:1",
                        "--set", "traffic.rates=[5]", "--set", "traffic.duration_s=5"],
                       capture_output=True, text=True, timeout=90, env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: executor.address 127.0.0.1:1: ") and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr and not out.exists() and p.stdout == ""


def test_a_ray_address_that_accepts_but_never_answers_is_refused_within_the_timeout():
    """A port that takes the connection and says nothing (not a Ray head: a wrong port, a firewall
    that swallows packets) is refused once the connect timeout has passed, not retried for minutes."""
    pytest.importorskip("ray")
    from batchlab.run.executors import check_ray_address

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ConfigError, match=f"executor.address {address}: no Ray cluster answered there within 1 s$"):
            check_ray_address(address, "executor.address", timeout_s=1.0)
        assert time.monotonic() - started < 30                 # ends at all; Ray alone retried for minutes


def test_a_ray_address_that_answers_in_another_protocol_is_refused_at_once(ray_local, tmp_path):
    """The dashboard's HTTP port (a common mix-up with the cluster's address) answers, but not in
    gRPC; a real Ray head passes the same check."""
    from batchlab.run.executors import check_ray_address

    with socket.socket() as http:
        http.bind(("127.0.0.1", 0))
        http.listen()
        address = f"127.0.0.1:{http.getsockname()[1]}"

        def answer():
            conn, _ = http.accept()
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()
        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(ConfigError, match="the port is open, but what answers does not speak Ray's protocol"):
            check_ray_address(address, "executor.address", timeout_s=10)
    check_ray_address(ray_local.get_runtime_context().gcs_address, "executor.address", timeout_s=10)
