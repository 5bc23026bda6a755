"""Commands whose stdout or stderr is a pipe nobody reads any more (`batchlab ... | head -n1`),
signalled while they run. Writing then fails with EPIPE; that may end a command early, but never
makes it hang, and never harms what it recorded: a rerun resumes to the same bytes."""
from __future__ import annotations

import signal
import subprocess

import httpx
import pytest

from tests.faults.conftest import batchlab, finish, kill_after, run
from tests.run.test_sweep import assert_same_files
from tests.server.conftest import free_port, wait_for

SWEEP = ["run", "--set", "strategies=[naive, continuous]", "--set", "traffic.rates=[4, 8]", "--set", "traffic.duration_s=30",
         "--set", "traffic.warmup_s=1", "--set", "report=false"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "r"
    assert run(*SWEEP, "--quiet", "--out", str(out))[0] == 0
    return out


@pytest.mark.parametrize("closed,sig", [("stdout", None), ("stderr", signal.SIGINT), ("stdout", signal.SIGTERM)])
def test_a_sweep_with_a_closed_pipe_ends_and_its_rerun_resumes_to_the_same_bytes(tmp_path, reference, closed, sig):
    out = tmp_path / "r"
    proc = batchlab(*SWEEP, "--out", str(out))
    getattr(proc, closed).close()                       # the reader is gone before the first line
    if sig is not None:
        kill_after(proc, 1.5, sig)                      # mid-sweep, or just after it on a fast machine
    finish(proc)
    assert run(*SWEEP, "--quiet", "--out", str(out))[0] == 0
    assert_same_files(reference, out)


def serving(*extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = batchlab("serve", "--strategy", "continuous", "--set", "backend.preset=toy", "--port", str(port), *extra)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, "batchlab serve ended"
            return False
    wait_for(up, 60, "batchlab serve")
    return proc, url


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_with_both_pipes_closed_stops_on_one_signal_within_its_timeout(sig):
    proc, url = serving("--shutdown-timeout", "3", "--max-model-len", "4000")
    try:
        proc.stdout.close()
        proc.stderr.close()
        with httpx.Client(timeout=20) as client, \
                client.stream("POST", url + "/v1/completions",
                              json={"model": "toy", "prompt": "go on", "max_tokens": 3000, "stream": True}) as stream:
            next(stream.iter_lines())                       # a stream in flight: the drain has work to cut
            proc.send_signal(sig)
            finish(proc, timeout=3 + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
