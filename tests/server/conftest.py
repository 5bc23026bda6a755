"""Start a real `batchlab serve` (uvicorn on a loopback port, in a thread) for the server tests."""
from __future__ import annotations

import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(strategy: str = "continuous", overrides: list[str] = (), names=("toy", "local-model"), **opts):
    """Yield (base_url, server) for a live server; shut it down afterwards."""
    from batchlab.run.config import load_config
    from batchlab.server.app import build_server, create_app, uvicorn_config
    from batchlab.server.connection import Limits

    cfg = load_config(None, ["backend.kind=sim", "backend.preset=toy", *overrides])
    server = build_server(cfg, strategy, names=names, **opts)
    port = free_port()
    # the protocol and limits `batchlab serve` runs with, on a thread (no signals: shutdown is tested on processes)
    uv = uvicorn.Server(uvicorn_config(create_app(server), Limits(), host="127.0.0.1", port=port))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("batchlab serve did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        uv.should_exit = True
        thread.join(10)


@pytest.fixture
def serve():
    return running_server


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    """Poll until predicate() is truthy (a bounded wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class ServeProcess:
    """`batchlab serve` as a subprocess (continuous over the toy simulator) on a free loopback port,
    started and waited for (/health answers); its stderr lines are collected by a thread."""

    def __init__(self, *args: str, strategy: str = "continuous", port: int | None = None):
        import httpx

        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "batchlab.cli", "serve", "--strategy", strategy,
                                      "--set", "backend.preset=toy", "--port", str(self.port), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stderr], daemon=True).start()
        deadline = time.monotonic() + 60
        while not self._healthy(httpx):
            assert self.proc.poll() is None and time.monotonic() < deadline, "batchlab serve did not come up"
            time.sleep(0.05)

    def _healthy(self, httpx) -> bool:
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

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
