"""Code that misbehaves inside batchlab: a policy of the user's (named `module:Class` in
`strategies`) or a backend that raises, hangs or calls sys.exit. A sweep records what failed and
goes on, or ends in one line; a hang ends on Ctrl-C (SIGINT) in one line; `batchlab serve` keeps
answering in OpenAI's shape and exits within --shutdown-timeout of SIGTERM whatever hangs."""
from __future__ import annotations

import signal
import subprocess
import time

import httpx
import pytest

from batchlab.run.results import ResultsDir
from tests.faults.conftest import ENDS_WITHIN_S, batchlab, finish, one_error_line, run, wait_for_path
from tests.server.conftest import free_port

POLICIES = '''
import sys
from batchlab.schedulers import ContinuousScheduler

class Raises(ContinuousScheduler):
    def next_waiting(self, now):
        raise RuntimeError("a bug in the policy")

class Hangs(ContinuousScheduler):
    def next_waiting(self, now):
        while True:
            pass

class Exits(ContinuousScheduler):
    def next_waiting(self, now):
        sys.exit(0)
'''
SWEEP = ["run", "--quiet", "--set", "traffic.rates=[4]", "--set", "traffic.duration_s=5", "--set", "traffic.warmup_s=1",
         "--set", "report=false"]


@pytest.fixture
def policies(tmp_path):
    (tmp_path / "bad_policies.py").write_text(POLICIES)
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    return tmp_path


def test_a_policy_that_raises_fails_its_requests_and_the_sweep_goes_on(policies):
    status, _, err = run(*SWEEP, "--out", "r", "--set", "strategies=[continuous, bad_policies:Raises]", cwd=policies)
    assert status == 0 and "Traceback" not in err
    assert "schedule() raised RuntimeError: a bug in the policy" in err
    assert set(ResultsDir(policies / "r").done_points()) == {("continuous", 4.0, 0), ("bad_policies:Raises", 4.0, 0)}


def test_a_policy_that_hangs_ends_on_sigint_in_one_line_and_keeps_what_finished(policies):
    proc = batchlab(*SWEEP, "--out", "r", "--set", "strategies=[continuous, bad_policies:Hangs]", cwd=policies)
    assert wait_for_path(policies / "r" / "summary.csv", proc)        # continuous is done; the policy hangs
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    status, _, err = finish(proc)
    assert status == 130 and one_error_line(err, "interrupted: ")
    assert set(ResultsDir(policies / "r").done_points()) == {("continuous", 4.0, 0)}
    status, _, _ = run(*SWEEP, "--out", "r", "--set", "strategies=[continuous, naive]", cwd=policies)
    assert status == 0 and set(ResultsDir(policies / "r").done_points()) == {("continuous", 4.0, 0), ("naive", 4.0, 0)}


def test_a_policy_that_calls_sys_exit_is_stopped_like_one_that_raises(policies):
    status, _, err = run(*SWEEP, "--out", "r", "--set", "strategies=[continuous, bad_policies:Exits]", cwd=policies)
    assert status == 0 and "bad_policies:Exits" in err
    assert ("bad_policies:Exits", 4.0, 0) in ResultsDir(policies / "r").done_points()


def test_a_policy_module_that_exits_on_import_is_one_error_line(policies):
    status, _, err = run(*SWEEP, "--out", "r", "--set", "strategies=[continuous, exits_on_import:Policy]", cwd=policies)
    assert status == 2 and "exits_on_import" in one_error_line(err)
    assert not (policies / "r").exists()


def test_a_backend_that_raises_fails_its_requests_and_the_sweep_goes_on(tmp_path):
    status, _, err = run(*SWEEP, "--out", str(tmp_path / "r"), "--set", "strategies=[continuous]", fault="backend-raises")
    assert status == 0 and "RuntimeError: injected backend fault" in err and "Traceback" not in err
    assert set(ResultsDir(tmp_path / "r").done_points()) == {("continuous", 4.0, 0)}


def test_a_backend_that_calls_sys_exit_fails_its_requests_like_one_that_raises(tmp_path):
    status, _, err = run(*SWEEP, "--out", str(tmp_path / "r"), "--set", "strategies=[continuous]", fault="backend-exits")
    assert status == 0 and "SystemExit" in err
    assert set(ResultsDir(tmp_path / "r").done_points()) == {("continuous", 4.0, 0)}


class FaultyServer:
    """`batchlab serve` (continuous, toy) with a backend fault, 3 s shutdown timeout."""

    def __init__(self, fault: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = batchlab("serve", "--strategy", "continuous", "--set", "backend.preset=toy", "--port", str(self.port),
                             "--shutdown-timeout", "3", fault=fault, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + ENDS_WITHIN_S
        while not self.get("/health"):
            assert self.proc.poll() is None and time.monotonic() < deadline, "batchlab serve did not come up"
            time.sleep(0.05)

    def get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(self.url + path, timeout=2)
        except httpx.HTTPError:
            return None

    def complete(self) -> httpx.Response | None:
        try:
            return httpx.post(self.url + "/v1/completions", json={"model": "toy", "prompt": "hi", "max_tokens": 4}, timeout=2)
        except httpx.HTTPError:
            return None

    def terminate(self) -> tuple[int, str]:
        """SIGTERM; the process must be gone within its 3 s timeout and a margin."""
        self.proc.send_signal(signal.SIGTERM)
        status, _, err = finish(self.proc, timeout=3 + 10)
        return status, err


def assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response is not None and response.status_code == status, response and response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("fault", ["backend-raises", "backend-exits"])
def test_serve_with_a_backend_that_raises_or_exits_answers_errors_and_stops_on_sigterm(fault):
    server = FaultyServer(fault)
    try:
        answers = [server.complete() for _ in range(3)]   # the first batch runs, then every one fails
        assert all(a is not None and a.status_code >= 500 for a in answers[1:]), [a and a.text for a in answers]
        for a in answers[1:]:
            assert_openai_error(a, a.status_code)
        health = server.get("/health")        # a failed (or exiting) batch fails its requests; the engine goes on
        assert health is not None and health.status_code == 200, health
        status, err = server.terminate()
        assert status in (-signal.SIGTERM, 128 + signal.SIGTERM) and "Traceback" not in err, err[-2000:]
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_serve_with_a_backend_that_hangs_exits_within_the_shutdown_timeout():
    server = FaultyServer("backend-hangs")
    try:
        assert server.complete() is None                    # the second step hangs, holding the loop
        status, err = server.terminate()
        assert status == 128 + signal.SIGTERM and "still running 3 s after the signal" in err
    finally:
        if server.proc.poll() is None:
            server.proc.kill()



@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, None)], ids=["sigint", "sigterm"])
def test_a_backend_that_hangs_inside_run_ends_on_a_signal_and_keeps_what_finished(tmp_path, sig, status):
    """naive's batches run; continuous' second step hangs, holding the thread. Ctrl-C ends the run in
    one line (130); SIGTERM ends it without a word, as a kill would; the naive point stays."""
    out = tmp_path / "r"
    proc = batchlab(*SWEEP, "--out", str(out), "--set", "strategies=[naive, continuous]", fault="backend-hangs-in-step")
    assert wait_for_path(out / "summary.csv", proc)                  # naive is done; continuous hangs
    time.sleep(0.5)
    proc.send_signal(sig)
    got, _, err = finish(proc)
    if status is not None:
        assert got == status and one_error_line(err, "interrupted: ")
    else:
        assert got in (-signal.SIGTERM, 128 + signal.SIGTERM) and "Traceback" not in err
    assert set(ResultsDir(out).done_points()) == {("naive", 4.0, 0)}
    status, _, err = run(*SWEEP, "--out", str(out), "--set", "strategies=[naive, continuous]")
    assert status == 0 and set(ResultsDir(out).done_points()) == {("naive", 4.0, 0), ("continuous", 4.0, 0)}, err
