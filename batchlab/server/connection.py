"""How long a client of `batchlab serve` may take, and how many may be connected at once.

uvicorn closes a connection left idle after a response (`timeout_keep_alive`) and bounds nothing
else: a connection that never sends a byte, headers sent a byte at a time, or more connections
than the machine can hold are kept for as long as the client likes. This protocol is uvicorn's
httptools one with those bounds added: a fresh connection counts as idle, a request's headers
must arrive within `timeout_header` of its first byte (408), and a request on a connection past
`limit_concurrency` is marked for a 503 (middleware.TooManyConnections). The answers it writes
itself (408, and 400 for bytes that are not HTTP) use OpenAI's error shape.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batchlab.server.middleware import OVER_LIMIT


@dataclass(frozen=True)
class Limits:
    """The connection limits of `batchlab serve` (seconds; None: no limit)."""
    timeout_keep_alive: float = 5.0     # idle, before a request or between two: uvicorn's and vLLM's 5 s
    timeout_header: float = 60.0        # first byte of a request to the end of its headers: nginx's and Node's 60 s
    limit_concurrency: int | None = None  # connections at once: unlimited, as uvicorn and vLLM


def protocol_for(limits: Limits) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn's Config(http=...) takes, holding `limits`."""
    return type("BoundedHttpToolsProtocol", (BoundedProtocol,), {"limits": limits})


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above (see the module docstring).
    NOTE: it overrides methods of uvicorn's protocol class (connection_made, on_message_begin,
    on_headers_complete, send_400_response); a uvicorn that renamed one would fail
    tests/server/test_limits.py, which drives each bound over a raw socket."""
    limits: ClassVar[Limits] = Limits()
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # uvicorn arms this only after a response; a connection that never starts a request is idle too
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.limits.timeout_header, self._headers_too_slow)

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        limit = self.limits.limit_concurrency
        if limit is not None and len(self.connections) > limit:
            self.scope[OVER_LIMIT] = True   # type: ignore[literal-required]
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        self._cancel_header_timer()
        self._answer(400, f"not a valid HTTP/1.1 request ({msg.rstrip('.')})", "invalid_http_request")

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self._answer(408, f"the request headers did not arrive within {self.limits.timeout_header:g} s "
                              "(--timeout-header)", "request_timeout")

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _answer(self, status: int, message: str, code: str) -> None:
        """Write one error answer in OpenAI's shape and close: the request is not read any further."""
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
        body = json.dumps({"error": error}).encode()
        head = [f"HTTP/1.1 {status} {REASONS[status]}", "content-type: application/json",
                f"content-length: {len(body)}", "connection: close"]
        head += [f"{k.decode()}: {v.decode()}" for k, v in self.server_state.default_headers]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.transport.close()


REASONS = {400: "Bad Request", 408: "Request Timeout"}
