"""A lean HTTP/1.1 client for one job: POST a JSON body and read the Server-Sent Events it streams.

The load generator's CPU is spent per request and per streamed event; through httpx, httpcore and
anyio every event costs an async iterator step, a chunk copy and several awaits, and a request
a dozen objects. Here a connection is an asyncio Protocol with httptools' response parser (the C
parser uvicorn uses), SSE lines are split out of each body piece as it is parsed, and each event
is handed to a callback *inside* the parser's callback: no task switch per event, one Future per
request. Connections are kept alive and reused; there are never more than the caller's semaphore
lets in flight (see OpenAIBackend.session).

What it keeps of httpx: a timeout on connecting and on silence between reads (not on the whole
answer: a long stream that keeps talking is not a timeout), no retries ever, the error body of a
non-200 answer, and errors named by the same class names (ConnectError, ReadTimeout,
RemoteProtocolError) so recorded failures read alike whichever client sent them.
Plain http:// only: an https:// endpoint goes through httpx (OpenAIBackend decides).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools


class HTTPFailure(Exception):
    """A request that did not get a complete answer; `kind` names it as httpx would."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.kind}: {self.args[0]}"


class Answer:
    """One exchange's outcome: status, the body of a non-200 answer, and whether the stream ended."""

    __slots__ = ("status", "error_body", "done", "sse_buf", "on_event")

    def __init__(self, on_event: Callable[[bytes], bool]):
        self.status = 0
        self.error_body: list[bytes] = []
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.sse_buf = b""
        self.on_event = on_event         # called with each event's data; returns True at the end ([DONE])


class Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self.closed = False
        self.last_read = 0.0
        self.raised: BaseException | None = None      # what an event callback raised inside the parser

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        a = self.answer
        if a is not None and not a.done.done() and a.status not in (0, 200):
            a.done.set_result(None)          # an error answer whose body ran to the connection's close
        elif a is not None and not a.done.done():
            a.done.set_exception(HTTPFailure("RemoteProtocolError",
                                             "peer closed connection without sending complete message body"))

    def data_received(self, data: bytes) -> None:
        self.last_read = self.pool.loop.time()
        a = self.answer
        if a is None:                     # bytes nobody asked for: the connection is not reusable
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(HTTPFailure("RemoteProtocolError", "the server switched protocols"))
        except httptools.HttpParserCallbackError as e:
            # the event callback's own error (a server error event, bad JSON), wrapped by the parser
            self.fail(self.raised or HTTPFailure("RemoteProtocolError", str(e)))
        except httptools.HttpParserError as e:
            self.fail(HTTPFailure("RemoteProtocolError", f"malformed HTTP answer ({e})"))

    # -- httptools callbacks ----------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self.answer.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        a = self.answer
        if a.status != 200:
            a.error_body.append(body)
            return
        *lines, a.sse_buf = (a.sse_buf + body).split(b"\n")
        for line in lines:
            try:
                end = line.startswith(b"data:") and a.on_event(line[5:].strip())
            except Exception as e:
                self.raised = e
                raise
            if end:
                # NOTE: the answer is complete at [DONE]; the chunked body's end follows, and the
                # connection is reused only if it comes (see on_message_complete)
                if not a.done.done():
                    a.done.set_result(None)
                return

    def on_message_complete(self) -> None:
        a = self.answer
        self.answer = None
        if not a.done.done():
            a.done.set_result(None)
        if self.parser.should_keep_alive() and not self.closed:
            self.pool.idle.append(self)
        else:
            self.abort()

    # -- ours ------------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        a = self.answer
        if a is not None and not a.done.done():
            a.done.set_exception(exc)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        self.answer = None
        if self.transport is not None:
            self.transport.abort()


class Pool:
    """Keep-alive connections to one http:// origin. The caller bounds how many are in flight."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float):
        u = urlsplit(base_url)
        if u.scheme != "http":
            raise ValueError(f"{base_url}: the lean client speaks plain http:// only")
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.path = u.path.rstrip("/")
        host = self.host if u.port is None else f"{self.host}:{u.port}"
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {"host": host, **headers}.items()).encode("latin-1")
        self.timeout_s = timeout_s
        self.idle: list[Connection] = []
        self.loop: asyncio.AbstractEventLoop | None = None     # the running loop, from the first request on
        self.every: set[Connection] = set()

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for c in list(self.every):
            c.abort()
        self.every.clear()
        self.idle.clear()

    async def connection(self) -> Connection:
        self.loop = self.loop or asyncio.get_running_loop()
        while self.idle:
            c = self.idle.pop()
            if not c.closed:
                return c
        try:
            _, c = await asyncio.wait_for(
                self.loop.create_connection(lambda: Connection(self), self.host, self.port), self.timeout_s)
        except TimeoutError:
            raise HTTPFailure("ConnectTimeout", f"no connection to {self.host}:{self.port} "
                                                f"within {self.timeout_s:g} s") from None
        except OSError as e:
            raise HTTPFailure("ConnectError", str(e) or type(e).__name__) from None
        self.every.add(c)
        return c

    async def post_sse(self, path: str, body: bytes, on_event: Callable[[bytes], bool],
                       on_sent: Callable[[], None] | None = None) -> Answer:
        """POST `body` (JSON) to `path` under the base URL; each SSE event's data goes to
        `on_event` as it is parsed. Returns the Answer once the stream ends ([DONE] or the body's
        end) or a non-200 answer has been read whole; raises HTTPFailure (or what `on_event` raised)."""
        c = await self.connection()
        a = Answer(on_event)
        c.answer = a
        if on_sent is not None:
            on_sent()
        c.transport.write(b"POST %s%s HTTP/1.1\r\n%scontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                          % (self.path.encode(), path.encode(), self.head, len(body), body))
        c.last_read = self.loop.time()
        timer = self.loop.call_at(c.last_read + self.timeout_s, self._silence, c, a)
        try:
            await a.done
        except asyncio.CancelledError:
            c.abort()
            raise
        finally:
            timer.cancel()
            if c.closed:
                self.every.discard(c)
        return a

    def _silence(self, c: Connection, a: Answer) -> None:
        """The read timeout: fail only after `timeout_s` with nothing read (checked when due)."""
        if a.done.done():
            return
        quiet_until = c.last_read + self.timeout_s
        if self.loop.time() < quiet_until:
            self.loop.call_at(quiet_until, self._silence, c, a)
            return
        c.fail(HTTPFailure("ReadTimeout", f"nothing read for {self.timeout_s:g} s"))
