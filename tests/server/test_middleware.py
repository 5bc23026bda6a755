"""LimitBody: a body over the limit is refused without being read into memory (fake ASGI, no server)."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("starlette")

from starlette.exceptions import HTTPException  # noqa: E402

from batchlab.server.middleware import LimitBody  # noqa: E402


class Wire:
    """The client's side: `chunks` body chunks of `size` bytes; counts how many the app pulled."""

    def __init__(self, chunks: int, size: int):
        self.left, self.size, self.pulled = chunks, size, 0
        self.sent: list[dict] = []

    async def receive(self):
        self.pulled += 1
        self.left -= 1
        return {"type": "http.request", "body": b"x" * self.size, "more_body": self.left > 0}

    async def send(self, message):
        self.sent.append(message)


async def reading_app(scope, receive, send):
    """Reads the whole body, as FastAPI does for a JSON body, then answers 200."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def scope(content_length: int | None):
    headers = [(b"content-type", b"application/json")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}


def run(app, scope_, wire):
    asyncio.run(app(scope_, wire.receive, wire.send))


def test_a_declared_length_over_the_limit_is_answered_413_before_a_byte_is_read():
    refused = []
    app = LimitBody(reading_app, max_bytes=1000, on_refuse=refused.append)
    wire = Wire(chunks=800, size=65536)                # a 50 MB body
    run(app, scope(800 * 65536), wire)
    assert wire.pulled == 0 and refused == [413]
    assert wire.sent[0]["status"] == 413
    assert (b"connection", b"close") in wire.sent[0]["headers"]
    error = json.loads(wire.sent[1]["body"])["error"]
    assert error["code"] == "request_too_large" and "1000" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_a_body_without_a_length_is_stopped_at_the_read_that_passes_the_limit():
    app = LimitBody(reading_app, max_bytes=2500, on_refuse=lambda status: None)
    wire = Wire(chunks=800, size=1000)
    with pytest.raises(HTTPException) as err:          # FastAPI turns it into the app's 413 answer
        run(app, scope(None), wire)
    assert err.value.status_code == 413 and wire.pulled == 3


def test_a_body_within_the_limit_passes_untouched():
    app = LimitBody(reading_app, max_bytes=4000, on_refuse=lambda status: pytest.fail("refused"))
    wire = Wire(chunks=4, size=1000)
    run(app, scope(4000), wire)
    assert wire.sent[0]["status"] == 200 and wire.sent[1]["body"] == b"4000" and wire.pulled == 4
