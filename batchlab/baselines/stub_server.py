"""A streaming stub of an OpenAI-compatible server: what a load generator is measured against.

It answers `GET /health`, `GET /v1/models` and streamed `POST /v1/completions` the way vLLM does (one SSE event
per token, `choices[0].text`, a final usage event when `stream_options.include_usage` is set,
`data: [DONE]`), over HTTP/1.1 keep-alive with chunked transfer encoding, and computes nothing:
every `itl_s` seconds one step writes the next token of every active stream, as a server stepping
a batch does. So the CPU it needs per token is a few microseconds, and on its own core it is never
what limits a client; what the client spends per request is then the client's alone.

    python -m batchlab.baselines.stub_server --port 8100 --itl-ms 5

NOTE: hand-rolled on asyncio's Protocol with httptools (uvicorn's request parser) rather than a
web framework: a framework's per-request and per-chunk cost is what the stub must not have.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

import httptools

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n")


def chunked(payload: bytes) -> bytes:
    """One piece of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return chunked(b"data: " + data.encode() + b"\n\n")


def plain(status: int, body: dict, reason: str = "OK") -> bytes:
    data = json.dumps(body).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason.encode(), len(data), data))


@dataclass
class Stream:
    """One answer in progress: tokens left to write, and the transport they go to."""
    transport: asyncio.Transport
    model: str
    prompt_tokens: int
    total: int
    usage: bool
    sent: int = 0
    prefix: bytes = field(init=False, repr=False)     # every event's JSON up to the token's text

    def __post_init__(self) -> None:
        self.prefix = (b'{"id":"cmpl-stub","object":"text_completion","created":0,"model":%s,"choices":[{"index":0,'
                       % json.dumps(self.model).encode())

    def next_event(self) -> bytes:
        self.sent += 1
        last = self.sent == self.total
        out = self.prefix + b'"text":" t%d","logprobs":null,"finish_reason":%s}],"usage":null}' % (
            self.sent, b'"length"' if last else b"null")
        frames = [chunked(b"data: " + out + b"\n\n")]
        if last:
            if self.usage:
                frames.append(event({"id": "cmpl-stub", "object": "text_completion", "created": 0,
                                     "model": self.model, "choices": [],
                                     "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.total,
                                               "total_tokens": self.prompt_tokens + self.total}}))
            frames.append(event("[DONE]") + b"0\r\n\r\n")
        return b"".join(frames)


class Stepper:
    """Writes one token to every active stream each `itl_s` seconds (absolute ticks: no drift)."""

    def __init__(self, itl_s: float):
        self.itl_s = itl_s
        self.active: list[Stream] = []
        self.handle: asyncio.TimerHandle | None = None
        self.steps = 0
        self.tokens = 0

    def add(self, s: Stream) -> None:
        self.active.append(s)
        if self.handle is None:
            loop = asyncio.get_running_loop()
            self.handle = loop.call_at(loop.time() + self.itl_s, self.step, loop.time() + self.itl_s)

    def step(self, due: float) -> None:
        self.steps += 1
        keep = []
        for s in self.active:
            if s.transport.is_closing():
                continue
            s.transport.write(s.next_event())
            self.tokens += 1
            if s.sent < s.total:
                keep.append(s)
        self.active = keep
        if not keep:
            self.handle = None
            return
        loop = asyncio.get_running_loop()
        due = max(due + self.itl_s, loop.time())           # a late step is not repeated to catch up
        self.handle = loop.call_at(due, self.step, due)


class StubProtocol(asyncio.Protocol):
    def __init__(self, stepper: Stepper, model: str):
        self.stepper, self.model = stepper, model
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url, self.body = b"", []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(plain(400, {"error": {"message": "bad request"}}, "Bad Request"))
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body, self.url, self.body = self.url, b"".join(self.body), b"", []
        method = self.parser.get_method()
        path = url.split(b"?", 1)[0]
        if method == b"GET" and path == b"/health":
            self.transport.write(plain(200, {"status": "ok"}))
        elif method == b"GET" and path == b"/v1/models":
            self.transport.write(plain(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}))
        elif method == b"POST" and path == b"/v1/completions":
            self.completion(body)
        else:
            self.transport.write(plain(404, {"error": {"message": f"no route {path.decode()}"}}, "Not Found"))

    def completion(self, raw: bytes) -> None:
        try:
            req = json.loads(raw)
            n = int(req["max_tokens"])
            prompt = req["prompt"]
        except (ValueError, KeyError, TypeError):
            self.transport.write(plain(400, {"error": {"message": "need a JSON body with prompt and max_tokens"}},
                                       "Bad Request"))
            return
        if not req.get("stream") or n < 1:
            self.transport.write(plain(400, {"error": {"message": "the stub only streams, max_tokens >= 1"}},
                                       "Bad Request"))
            return
        tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        model = str(req.get("model", self.model))
        self.transport.write(HEAD)
        self.stepper.add(Stream(self.transport, model, tokens, n, usage))


async def serve(host: str, port: int, itl_s: float, model: str, ready: asyncio.Future | None = None,
                stop: asyncio.Event | None = None) -> Stepper:
    """Serve until `stop` is set (or for ever); `ready` gets the bound port (port 0: any free one)."""
    stepper = Stepper(itl_s)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: StubProtocol(stepper, model), host, port, backlog=4096)
    if ready is not None:
        ready.set_result(server.sockets[0].getsockname()[1])
    async with server:
        if stop is None:
            await server.serve_forever()
        else:
            await stop.wait()
    return stepper


def run(main):
    """asyncio.run on uvloop where it is installed (a cheaper loop: the stub must not be the limit)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--itl-ms", type=float, default=5.0, help="milliseconds between a stream's tokens")
    ap.add_argument("--model", default="stub")
    args = ap.parse_args()
    print(f"stub serving {args.model} on http://{args.host}:{args.port}/v1 at {args.itl_ms:g} ms per token "
          f"(started {time.strftime('%H:%M:%S')})", flush=True)
    try:
        run(serve(args.host, args.port, args.itl_ms / 1000.0, args.model))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
