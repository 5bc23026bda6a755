"""A crowd of slow and broken clients against one `batchlab serve` with 1-second limits, while a
well-behaved client is served. Each misbehaving connection (seeded mix: idle, headers a byte at a
time, headers without their body, a short body, bytes that are not HTTP) must be closed by the
server within its limit plus a generous margin, with the answer its limit promises."""
from __future__ import annotations

import json
import random
import socket
import threading
import time

import openai

from tests.server.conftest import ServeProcess

LIMIT_S = 1.0
MARGIN_S = 10.0
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
EXPECTED = {"idle": None, "slowloris": 408, "headers-only": 408, "short-body": 408, "not-http": 400}


def misbehave(port: int, kind: str) -> int | None:
    """Act out `kind` on a fresh connection; the status the server answered (None: closed silently).
    Raises socket.timeout if the server keeps the connection past the margin."""
    with socket.create_connection(("127.0.0.1", port), timeout=LIMIT_S + MARGIN_S) as sock:
        if kind == "slowloris":
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
            try:
                for _ in range(int((LIMIT_S + MARGIN_S) / 0.1)):
                    sock.sendall(b"X")
                    time.sleep(0.1)
            except OSError:                       # closed under us: the answer is waiting
                pass
        elif kind == "headers-only":
            sock.sendall(HEAD)
        elif kind == "short-body":
            sock.sendall(HEAD + b'{"model": ')
        elif kind == "not-http":
            sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    if not data:
        return None
    status = int(data.split(b" ", 2)[1])
    assert set(json.loads(data.partition(b"\r\n\r\n")[2])["error"]) == {"message", "type", "param", "code"}
    return status


def test_slow_and_broken_clients_are_closed_within_their_limits_while_others_are_served():
    mix = random.Random(5)
    kinds = [mix.choice(list(EXPECTED)) for _ in range(20)]
    results: dict[int, object] = {}
    with ServeProcess("--timeout-keep-alive", str(LIMIT_S), "--timeout-header", str(LIMIT_S),
                      "--timeout-body", str(LIMIT_S)) as server:
        def act(i: int, kind: str) -> None:
            try:
                results[i] = misbehave(server.port, kind)
            except Exception as e:  # noqa: BLE001 - reported below with the client's kind
                results[i] = e
        threads = [threading.Thread(target=act, args=(i, k)) for i, k in enumerate(kinds)]
        for t in threads:
            t.start()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30)
        for _ in range(5):                        # served meanwhile
            assert client.completions.create(model="toy", prompt="hello", max_tokens=3).usage.completion_tokens == 3
        for t in threads:
            t.join(LIMIT_S + 2 * MARGIN_S)
    assert {i: (kinds[i], results.get(i)) for i in range(len(kinds)) if results.get(i) != EXPECTED[kinds[i]]} == {}
    assert set(kinds) == set(EXPECTED)            # the mix holds every kind
