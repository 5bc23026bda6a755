"""`batchlab serve` as a process: option errors, the listening socket, and shutdown on a signal.

Shutdown is tested on a real subprocess on a free loopback port. Waits are bounded (a server
that never exits fails the test), and the bounds are far from what the checks tell apart (a
server that waited for its streams would need tens of seconds).
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from batchlab.errors import ConfigError
from batchlab.server.app import serve_cmd
from batchlab.server.process import listen
from tests.server.conftest import ServeProcess, wait_for


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
    server = ServeProcess("--max-model-len", "4000", "--shutdown-timeout", "3")
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
    server = ServeProcess("--max-model-len", "4000", "--shutdown-timeout", "120")
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


def _serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "batchlab.cli", "serve", "--strategy", "continuous", "--set", "backend.preset=toy",
            *args]


def _banner_port(proc: subprocess.Popen) -> int:
    """Read stderr up to the banner (`... on http://127.0.0.1:PORT/v1`) and return its port."""
    for line in proc.stderr:
        if " on http://" in line:
            return int(line.rsplit(":", 1)[1].split("/")[0])
    raise AssertionError(f"no banner; exit status {proc.wait(10)}")


@pytest.mark.parametrize("in_flight", [False, True])
def test_sigterm_ends_the_server_when_its_stderr_is_a_closed_pipe(in_flight):
    """`batchlab serve ... 2>&1 | head -n1`: once the reader has gone, writing the shutdown notice
    fails with EPIPE; the server must still stop (the first signal within --shutdown-timeout, a
    second one at once), not keep serving until SIGKILL."""
    timeout = 120 if in_flight else 3
    proc = subprocess.Popen(_serve_cmd("--port", "0", "--max-model-len", "4000", "--shutdown-timeout", str(timeout)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{_banner_port(proc)}"
        wait_for(lambda: _healthy(url), 30, "/health")
        proc.stderr.close()                          # the reader goes: the next write to stderr is EPIPE
        with httpx.Client(timeout=20) as client:
            opened = streams(client, url, 1, 3000)[0] if in_flight else []
            proc.send_signal(signal.SIGTERM)
            if in_flight:
                time.sleep(0.5)                      # the first signal is being handled: a drain of up to 119 s
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)                    # raises if the server outlives its promise
            for s in opened:
                s.__exit__(None, None, None)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_port_0_banner_comes_once_connections_are_accepted():
    """A script that reads the banner and connects at once must be served, not refused."""
    proc = subprocess.Popen(_serve_cmd("--port", "0"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = _banner_port(proc)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200   # no retry
    finally:
        proc.kill()
        proc.wait(10)


def test_during_shutdown_every_request_the_server_reads_gets_503_in_the_openai_shape():
    """From the signal until the drain ends (here: a stream still running, up to 3 of the 4 s), a
    new request gets 503 `shutting_down` with Connection: close, on a new connection or on one kept
    alive from before the signal, and /health answers 503; the stream in flight ends with an error
    event, and the process exits within the timeout."""
    body = {"model": "toy", "prompt": "hello there", "max_tokens": 2}
    with ServeProcess("--max-model-len", "4000", "--shutdown-timeout", "4") as server, \
            httpx.Client(timeout=20) as kept, httpx.Client(timeout=20) as other:
        assert kept.post(server.url + "/v1/completions", json=body).status_code == 200   # a connection kept alive
        opened, lines = streams(other, server.url, 1, 3000)
        server.proc.send_signal(signal.SIGTERM)
        answers = []
        for delay in (0.05, 0.5, 1.0):
            time.sleep(delay)
            answers.append(kept.post(server.url + "/v1/completions", json=body))
            answers.append(httpx.post(server.url + "/v1/completions", json=body, timeout=20))
        health = httpx.get(server.url + "/health", timeout=20)
        for a in answers:
            assert a.status_code == 503 and a.headers["connection"] == "close", (a.status_code, a.text)
            assert a.json()["error"] == {"message": "the server is shutting down", "type": "service_unavailable",
                                         "param": None, "code": "shutting_down"}
        assert health.status_code == 503 and health.json()["error"] == "shutting down"
        rest = [line for line in lines[0] if line]
        assert rest[-1] == "data: [DONE]" and "shutting down" in rest[-2]
        opened[0].__exit__(None, None, None)
        assert server.proc.wait(timeout=15) == -signal.SIGTERM


def test_help_names_every_server_limit_with_its_default():
    res = CliRunner().invoke(serve_cmd, ["--help"], terminal_width=200)
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for option, default in [("--timeout-keep-alive", "5"), ("--timeout-header", "60"), ("--timeout-body", "60"),
                            ("--limit-concurrency", None), ("--max-body-bytes", "1048576"),
                            ("--shutdown-timeout", "10")]:
        assert option in text, option
        if default is not None:
            assert f"{option}" in text and f"[default: {default}" in text.split(option, 1)[1].split("--", 1)[0], option
