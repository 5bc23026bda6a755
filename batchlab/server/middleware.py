"""The small ASGI middlewares of `batchlab serve`."""
from __future__ import annotations

from collections.abc import Callable

from starlette.exceptions import HTTPException

from batchlab.server.protocol import APIError


class StampArrival:
    """ASGI middleware, outermost: a request's arrival is when its HTTP message was received,
    before routing, body parsing and validation, which are the server's work and count in TTFT."""

    def __init__(self, app, clock):
        self.app, self.clock = app, clock

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope["batchlab_arrival"] = self.clock.now()
        await self.app(scope, receive, send)


class CloseConnections:
    """ASGI middleware: answer every response with `Connection: close`.

    NOTE: for clients that share one connection pool across event loops (a load-test script that
    calls asyncio.run() per level with one AsyncOpenAI client): a kept-alive connection
    from a closed loop breaks their next request, against any keep-alive server."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def closing(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)
        await self.app(scope, receive, closing if scope["type"] == "http" else send)


class LimitBody:
    """ASGI middleware: refuse a request body over `max_bytes` with 413, never reading it into memory.

    A Content-Length over the limit is answered at once, before a byte of the body is read. A body
    without one (chunked) is counted as it streams in: the read that passes the limit raises
    HTTPException(413), which FastAPI's body reader lets through to the app's error handlers.
    `on_refuse(413)` counts the answers this middleware sends itself."""

    def __init__(self, app, max_bytes: int, on_refuse: Callable[[int], None]):
        self.app, self.max_bytes, self.on_refuse = app, max_bytes, on_refuse

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            self.on_refuse(413)
            return await self._too_large(declared)(scope, receive, send)
        seen = 0

        async def counting():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self._message(f"over {self.max_bytes} bytes"), {"Connection": "close"})
            return message
        await self.app(scope, counting, send)

    def _message(self, size: str) -> str:
        return f"request body is {size}; this server accepts at most {self.max_bytes} bytes (--max-body-bytes)"

    def _too_large(self, size: int):
        return APIError(413, self._message(f"{size} bytes"), code="request_too_large",
                        headers={"Connection": "close"}).response()


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
