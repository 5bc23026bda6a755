"""Managed servers on a stand-in (a few lines of http.server): started, ready, stopped however the
block ends, their workers with them; a server that dies or never answers is one error with its
log; one left running by an earlier run is found and stopped before its port is reused."""
from __future__ import annotations

import socket
import sys

import httpx
import pytest

from batchlab.backends import process
from batchlab.errors import ConfigError

SERVER = """
import http.server, os, signal, subprocess, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "exit":
    print("cannot load the model"); sys.exit(3)
if mode == "stubborn":      # ignores SIGTERM and leaves a worker of its own
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if mode == "silent":
    time.sleep(600)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_DATA", str(tmp_path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stand_in(mode: str = "ok") -> tuple[list[str], str]:
    port = free_port()
    return [sys.executable, "-c", SERVER, str(port), mode], f"http://127.0.0.1:{port}/v1"


def test_a_managed_server_answers_inside_the_block_and_is_gone_after_it_even_on_an_error():
    cmd, url = stand_in()
    with pytest.raises(RuntimeError, match="the benchmark broke"):
        with process.managed("stand-in", cmd, url, "m", wait_s=30, echo=print) as running:
            assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
            assert process.read("stand-in") == running and process.members(running.pid)
            raise RuntimeError("the benchmark broke")
    assert not process.members(running.pid) and process.read("stand-in") is None and process.orphans() == []


def test_stopping_ends_the_whole_group_even_what_ignores_sigterm():
    cmd, url = stand_in("stubborn")
    said: list[str] = []
    with process.managed("stubborn", cmd, url, "m", wait_s=30, echo=said.append) as running:
        assert len(process.members(running.pid)) == 2                     # the server and its worker
        process.stop("stubborn", grace_s=0.5, echo=said.append)
    assert not process.members(running.pid) and said == []


def test_a_server_that_exits_at_start_is_one_error_with_its_log():
    cmd, url = stand_in("exit")
    with pytest.raises(ConfigError, match="exited with status 3") as e:
        with process.managed("broken", cmd, url, "m", wait_s=30):
            pass
    assert "cannot load the model" in str(e.value) and process.read("broken") is None


def test_a_server_that_never_answers_is_stopped_and_said_so():
    cmd, url = stand_in("silent")
    with pytest.raises(ConfigError, match="did not answer /health within 1 s"):
        with process.managed("silent", cmd, url, "m", wait_s=1):
            pass
    assert process.orphans() == [] and process.read("silent") is None


def test_a_server_left_by_an_earlier_run_is_an_orphan_and_is_stopped_before_its_port_is_reused():
    cmd, url = stand_in()
    left, proc = process.start("left-behind", cmd, url, "m")
    process.wait_ready(left, proc, 30)
    assert process.orphans() == [left]
    said: list[str] = []
    with process.managed("fresh", cmd, url, "m", wait_s=30, echo=said.append) as running:
        assert running.pid != left.pid and process.orphans() == [running]
    proc.wait(5)
    assert said == [f"warning: stopping left-behind (pid {left.pid}), left running at {url} by an earlier run"]
    assert process.orphans() == []


def test_stopping_what_was_never_started_is_a_no_op():
    assert process.stop("never", echo=print) is None


def test_the_serve_command_and_an_unpinned_machine():
    cmd = process.serve_command(8010, "continuous", "c.yaml", ["backend.kind=sim"], "tiny", "--max-queue", "9")
    assert cmd[1:] == ["-m", "batchlab.cli", "serve", "c.yaml", "--strategy", "continuous", "--port", "8010",
                       "--model-name", "tiny", "--max-queue", "9", "--set", "backend.kind=sim"]
    assert process.split_cores(pin=False) is None


def test_a_taskset_list_is_read_as_core_numbers():
    from batchlab.backends.process import cpu_list
    assert cpu_list("1") == [1] and cpu_list("0,2") == [0, 2] and cpu_list("2-4,7") == [2, 3, 4, 7]
