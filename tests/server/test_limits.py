"""`batchlab serve`'s connection limits on a real server process, over raw sockets.

A client that sends nothing, sends its headers a byte at a time, or promises a body it never
sends must not hold a connection for longer than the limit that covers it (--timeout-keep-alive,
--timeout-header, --timeout-body); a request over --limit-concurrency and a request line that is
not HTTP get an answer in OpenAI's error shape. The server runs with 1-second limits; the bounds
below only say that a connection ends at all, long before the minutes it was held without them.
"""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.server.conftest import ServeProcess

LIMIT_S = 1.0
MARGIN_S = 10.0               # "ends at all": far above the limit, far below "held for minutes"


@pytest.fixture(scope="module")
def server():
    with ServeProcess("--timeout-keep-alive", str(LIMIT_S), "--timeout-header", str(LIMIT_S),
                      "--timeout-body", str(LIMIT_S)) as s:
        yield s


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=LIMIT_S + MARGIN_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it never does)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def assert_openai_error(raw: bytes, status: int, code: str | None = None) -> dict:
    got, headers, body = parse(raw)
    assert got == status, raw[:300]
    assert headers["content-type"] == "application/json" and headers.get("connection") == "close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(server):
    with connect(server) as sock:
        assert read_until_closed(sock) == b""          # closed without a word: no request was started


def test_headers_sent_a_byte_at_a_time_get_408_within_the_header_timeout(server):
    with connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + LIMIT_S + MARGIN_S
        try:
            while time.monotonic() < deadline:       # slowloris: one byte of a header every 0.1 s
                sock.sendall(b"X")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        error = assert_openai_error(read_until_closed(sock), 408, "request_timeout")
        assert "--timeout-header" in error["message"]


@pytest.mark.parametrize("sent", [b"", b'{"model": "toy"'], ids=["headers-only", "short-body"])
def test_a_body_shorter_than_its_content_length_gets_408_within_the_body_timeout(server, sent):
    with connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n" + sent)
        error = assert_openai_error(read_until_closed(sock), 408, "request_timeout")
        assert "--timeout-body" in error["message"]


def test_a_request_line_that_is_not_http_gets_400_in_the_openai_shape(server):
    with connect(server) as sock:
        sock.sendall(b"HELLO THERE\r\n\r\n")
        assert_openai_error(read_until_closed(sock), 400)


def test_a_request_over_the_connection_limit_gets_503_in_the_openai_shape():
    # its own server: idle connections must stay open while the request over the limit is sent
    with ServeProcess("--limit-concurrency", "2", "--timeout-keep-alive", "60") as server:
        others = [connect(server) for _ in range(2)]       # the limit: 2 connections at once
        try:
            with connect(server) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                error = assert_openai_error(read_until_closed(sock), 503, "too_many_connections")
                assert "--limit-concurrency" in error["message"]
        finally:
            for s in others:
                s.close()
        deadline = time.monotonic() + MARGIN_S
        while httpx.get(server.url + "/health", timeout=MARGIN_S).status_code != 200:   # free again
            assert time.monotonic() < deadline
            time.sleep(0.05)
