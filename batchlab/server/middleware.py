"""The small ASGI middlewares of `batchlab serve`."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.exceptions import HTTPException

from batchlab.server.protocol import APIError
from batchlab.server.stream import RAW_SEND

CLOSE = {"Connection": "close"}
OVER_LIMIT = "batchlab_over_connection_limit"     # a scope key the connection layer sets (server/connection.py)


class StampArrival:
    """ASGI middleware, outermost: a request's arrival is when its HTTP message was received,
    before routing, body parsing and validation, which are the server's work and count in TTFT.
    It also leaves the connection's own `send` in the scope, where an event stream writes its
    events past the application's wrappers (server/stream.py)."""

    def __init__(self, app, clock):
        self.app, self.clock = app, clock

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope["batchlab_arrival"] = self.clock.now()
            scope[RAW_SEND] = send
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
    """ASGI middleware: a request body must be at most `max_bytes` and complete within `timeout_s`
    of its headers; over the size it gets 413 without being read into memory, too slow it gets 408.

    A Content-Length over the limit is answered at once, before a byte of the body is read. A body
    without one (chunked) is counted as it streams in: the read that passes the limit raises
    HTTPException(413), which FastAPI's body reader lets through to the app's error handlers. A read
    still waiting at the deadline (a body shorter than its Content-Length, headers and no body)
    raises HTTPException(408) the same way. Both answers close the connection: the rest of the body
    is never read. `on_refuse(413)` counts the answers this middleware sends itself."""

    def __init__(self, app, max_bytes: int, on_refuse: Callable[[int], None], timeout_s: float = 60.0):
        self.app, self.max_bytes, self.on_refuse, self.timeout_s = app, max_bytes, on_refuse, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            self.on_refuse(413)
            return await self._too_large(declared)(scope, receive, send)
        seen, complete = 0, False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def counting():
            nonlocal seen, complete
            if complete:                  # NOTE: later reads wait for a disconnect, for as long as the answer takes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {self.timeout_s:g} s of its "
                                         "headers (--timeout-body)", CLOSE) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if seen > self.max_bytes:
                    raise HTTPException(413, self._message(f"over {self.max_bytes} bytes"), CLOSE)
            return message
        await self.app(scope, counting, send)

    def _message(self, size: str) -> str:
        return f"request body is {size}; this server accepts at most {self.max_bytes} bytes (--max-body-bytes)"

    def _too_large(self, size: int):
        return APIError(413, self._message(f"{size} bytes"), code="request_too_large", headers=CLOSE).response()


class TooManyConnections:
    """ASGI middleware: answer 503 to a request the connection layer marked as over
    --limit-concurrency (server/connection.py), in OpenAI's shape and counted like every refusal."""

    def __init__(self, app, limit: int | None, on_refuse: Callable[[int], None]):
        self.app, self.limit, self.on_refuse = app, limit, on_refuse

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get(OVER_LIMIT):
            self.on_refuse(503)
            refusal = APIError(503, f"server busy: {self.limit} connections already open (--limit-concurrency); "
                                    "retry later", code="too_many_connections", headers=CLOSE | {"Retry-After": "1"})
            return await refusal.response()(scope, receive, send)
        await self.app(scope, receive, send)


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
