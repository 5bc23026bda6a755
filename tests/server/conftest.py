"""Start a real `batchlab serve` (uvicorn on a loopback port, in a thread) for the server tests."""
from __future__ import annotations

import contextlib
import socket
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
    from batchlab.server.app import build_server, create_app

    cfg = load_config(None, ["backend.kind=sim", "backend.preset=toy", *overrides])
    server = build_server(cfg, strategy, names=names, **opts)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=port,
                                       log_level="warning", access_log=False))
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
