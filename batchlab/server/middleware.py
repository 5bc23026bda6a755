"""Two small ASGI middlewares of `batchlab serve`."""
from __future__ import annotations


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

    NOTE: for clients that share one connection pool across event loops (the seed's load-test
    script calls asyncio.run() per level with one AsyncOpenAI client): a kept-alive connection
    from a closed loop breaks their next request, against any keep-alive server."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def closing(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)
        await self.app(scope, receive, closing if scope["type"] == "http" else send)
