"""`batchlab serve` as a process: option errors, the listening socket, and shutdown on a signal.

Shutdown is tested on a real subprocess on a free loopback port. Waits are bounded (a server
that never exits fails the test), and the bounds are far from what the checks tell apart (a
server that waited for its streams would need tens of seconds).
"""
from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from click.testing import CliRunner

from batchlab.errors import ConfigError
from batchlab.server.app import serve_cmd
from batchlab.server.process import listen
from tests.server.conftest import free_port


@pytest.mark.parametrize("args,needle", [
    (["--port", "99999"], "'--port': 99999 is not in the range 0<=x<=65535"),
    (["--port", "many"], "'--port': 'many' is not a valid integer"),
    (["--max-queue", "0"], "'--max-queue': 0 is not in the range x>=1"),
    (["--max-body-bytes", "0"], "'--max-body-bytes'"),
    (["--shutdown-timeout", "-1"], "'--shutdown-timeout'"),
    (["--shutdown-timeout", "nan"], "--shutdown-timeout must be a finite number"),
    (["--flush-idle-ms", "inf"], "--flush-idle-ms must be a finite number"),
    (["--log-level", "loud"], "'--log-level': 'loud' is not one of"),
    (["--max-model-len", "8", "--default-max-tokens", "8"], "--default-max-tokens (8) must be below --max-model-len (8)"),
    (["--host", "no-such-host.invalid"], "cannot listen on no-such-host.invalid:"),
])
def test_bad_options_are_one_error_line_exit_2_and_no_banner(args, needle):
    res = CliRunner().invoke(serve_cmd, ["--set", "backend.preset=toy", "--port", "0", *args])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: ") and needle in res.output and len(res.output.strip().splitlines()) == 1
    assert "batchlab serve:" not in res.output and "Traceback" not in res.output


def test_a_port_in_use_is_an_error_before_the_banner():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = CliRunner().invoke(serve_cmd, ["--set", "backend.preset=toy", "--port", str(port)])
        assert res.exit_code == 2 and res.output == f"error: cannot listen on 127.0.0.1:{port}: the port is already in use\n"
        with pytest.raises(ConfigError, match="already in use"):
            listen("127.0.0.1", port)


def test_listen_binds_port_zero_to_a_free_port():
    with listen("127.0.0.1", 0) as sock:
        assert sock.getsockname()[1] > 0


def test_the_issues_command_exits_at_once_with_one_line():
    """`batchlab serve --port 99999` printed a banner and hung."""
    p = subprocess.run([sys.executable, "-m", "batchlab.cli", "serve", "--port", "99999"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1


class Serve:
    """A `batchlab serve` subprocess (continuous over the toy simulator) and its stderr lines."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "batchlab.cli", "serve", "--strategy", "continuous",
                                      "--set", "backend.preset=toy", "--port", str(self.port), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stderr], daemon=True).start()
        deadline = time.monotonic() + 30
        while not self._healthy():
            assert self.proc.poll() is None and time.monotonic() < deadline, "batchlab serve did not come up"
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_for_line(self, needle: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if needle in line:
                return line
        raise AssertionError(f"no stderr line with {needle!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def streams(client: httpx.Client, url: str, n: int, max_tokens: int):
    """n streaming completions, each already streaming (its first event read)."""
    body = {"model": "toy", "prompt": "keep going", "max_tokens": max_tokens, "stream": True}
    opened = [client.stream("POST", url + "/v1/completions", json=body) for _ in range(n)]
    lines = [s.__enter__().iter_lines() for s in opened]
    for it in lines:
        assert next(it).startswith("data: {")
    return opened, lines


def test_sigterm_ends_streams_with_an_error_event_and_exits_within_the_timeout():
    # 8 streams of 3000 tokens take ~13 s on the toy simulator: they must be cut at ~2 s.
    server = Serve("--max-model-len", "4000", "--shutdown-timeout", "3")
    try:
        with httpx.Client(timeout=20) as client:
            opened, lines = streams(client, server.url, 8, 3000)
            server.proc.send_signal(signal.SIGTERM)
            assert "2 s to finish" in server.wait_for_line("shutting down")
            for it, s in zip(lines, opened):
                rest = [line for line in it if line]
                assert rest[-1] == "data: [DONE]"
                assert json.loads(rest[-2][len("data: "):])["error"]["message"] == "the server is shutting down"
                s.__exit__(None, None, None)
        assert server.proc.wait(timeout=15) == -signal.SIGTERM     # uvicorn's clean exit re-raises the signal
    finally:
        server.stop()


def test_a_second_signal_exits_at_once():
    server = Serve("--max-model-len", "4000", "--shutdown-timeout", "120")
    try:
        with httpx.Client(timeout=20) as client:
            opened, lines = streams(client, server.url, 3, 3000)
            server.proc.send_signal(signal.SIGINT)
            server.wait_for_line("shutting down")
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=15) == 128 + signal.SIGTERM    # not 120 s later
            assert server.wait_for_line("second signal")
            for it in lines:
                with pytest.raises(httpx.HTTPError):                      # cut, not finished
                    for _ in it:
                        pass
    finally:
        server.stop()
