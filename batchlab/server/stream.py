"""A server-sent event stream written straight to the connection.

Starlette's StreamingResponse passes every event through the application's send wrappers (the
exception handlers' and each middleware's), one await per layer per event; at 128 running
streams that is thousands of events a second on the core the model computes on. Here the
response head goes through the application as usual (middlewares may add headers, the error
handlers see that a response started) and the events go to the connection's own `send`, which
the outermost middleware left in the scope (`RAW_SEND`). A client that disconnects is noticed
by a task reading the request's `receive`: `on_gone` is called, and the stream ends its request.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse

RAW_SEND = "batchlab_send"      # the scope key holding the connection's own send


class EventStream(StreamingResponse):
    def __init__(self, events: AsyncIterator[bytes], on_gone: Callable[[], None]):
        super().__init__(events, media_type="text/event-stream")
        self.on_gone = on_gone

    async def __call__(self, scope, receive, send) -> None:
        raw = scope.get(RAW_SEND, send)
        watch = asyncio.ensure_future(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await raw({"type": "http.response.body", "body": chunk, "more_body": True})
            await raw({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watch.cancel()

    async def _watch(self, receive) -> None:
        await self.listen_for_disconnect(receive)
        self.on_gone()
