"""`batchlab serve`: an OpenAI-compatible HTTP server over any batchlab scheduler and backend.

FastAPI handles HTTP; the engine (server/engine.py) runs the same driver and scheduler as an
offline sweep, so a strategy behaves identically in-process and behind HTTP. A request is
stamped on arrival, validated (400/404, OpenAI-style errors), refused with 429 + Retry-After
when `max_queue` requests already wait, then streamed as server-sent events (or returned whole)
with exact usage counts. A client that disconnects has its request cancelled and its slot freed.
"""
from __future__ import annotations

import asyncio
import itertools
import sys
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import click
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from batchlab.cli import user_errors
from batchlab.core.clock import RealClock
from batchlab.core.config import ConfigError, RunConfig, load_config
from batchlab.core.request import Request, Status
from batchlab.server.engine import Engine
from batchlab.server.metrics import ServerMetrics
from batchlab.server.protocol import DONE, APIError, ChatBody, Chunks, CompletionBody, validation_message
from batchlab.server.text import TextCodec


SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class ServeOptions:
    model_names: tuple[str, ...]      # names clients may ask for; the first is listed by /v1/models
    max_queue: int = 256              # requests waiting to be scheduled before new ones get 429
    max_model_len: int | None = None  # tokens of context: prompt + max_tokens must fit (None: the model's)
    default_max_tokens: int = 16      # when a request gives no max_tokens (OpenAI's default)
    retry_after_s: int = 1            # Retry-After header on 429
    engine_thread: bool = False       # run the driver on its own thread (for a backend that blocks the loop)
    flush_idle_s: float | None = 1.0  # seconds without arrivals before partial batches are flushed


@dataclass(eq=False)
class Stream:
    """A live request as the HTTP side sees it."""
    request: Request
    chunks: Chunks
    event: asyncio.Event
    sent: int = 0                     # output tokens already written to the client
    text_state: dict | None = None


class Server:
    def __init__(self, engine: Engine, opts: ServeOptions):
        self.engine, self.opts = engine, opts
        self.codec = TextCodec()              # the backend's tokenizer once it has loaded (start)
        self.max_model_len = opts.max_model_len or 4096
        self.clock = engine.clock
        self.streams: dict[Request, Stream] = {}
        self.metrics = ServerMetrics(self.queue_depth, lambda: engine.running_count())
        engine.on_batch = self.metrics.batch_size.observe
        engine.on_done = self.metrics.observe_done
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    def queue_depth(self) -> int:
        return sum(1 for r in list(self.streams) if r.status is Status.QUEUED)

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        threaded = self.opts.engine_thread
        notify = (lambda reqs: loop.call_soon_threadsafe(self._wake, reqs)) if threaded else self._wake
        await self.engine.start(notify, threaded=threaded)
        model, tokenizer = _loaded(self.engine.backend)
        self.codec = TextCodec(tokenizer)
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_model_len = self.opts.max_model_len or context or 4096
        self.engine.backend.reset_peak_memory()   # peaks are measured from here: loaded and warm

    def _wake(self, reqs: list[Request]) -> None:
        for r in reqs:
            s = self.streams.get(r)
            if s is not None:
                s.event.set()

    async def handle(self, body: CompletionBody | ChatBody, http: HTTPRequest) -> Response:
        arrival = http.scope.get("batchlab_arrival") or self.clock.now()
        chat = isinstance(body, ChatBody)
        r = self._admit(body, chat, arrival)
        s = Stream(r, Chunks(r.request_id, body.model, chat), asyncio.Event(), text_state={})
        self.streams[r] = s
        self.engine.submit(r)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(self._events(s, usage), media_type="text/event-stream")
        return await self._whole(s, http)

    # --- admission --------------------------------------------------------------------------
    def _admit(self, body, chat: bool, arrival: float) -> Request:
        """Validate and build the request; raises APIError (4xx, 429, 503)."""
        if body.model not in self.opts.model_names:
            raise APIError(404, f"The model '{body.model}' does not exist; this server serves "
                                f"{', '.join(self.opts.model_names)}", "model", "model_not_found")
        if body.n != 1:
            raise APIError(400, "n must be 1 (one choice per request)", "n")
        max_tokens = body.wanted_tokens if body.wanted_tokens is not None else self.opts.default_max_tokens
        if max_tokens <= 0:
            raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
        text, ids, n = self._prompt(body, chat)
        if n + max_tokens > self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens; "
                                f"the request needs {n} prompt + {max_tokens} output tokens", "prompt",
                           "context_length_exceeded")
        if not self.engine.alive:
            raise APIError(503, f"the engine has stopped: {self.engine.error}")
        if self.queue_depth() >= self.opts.max_queue:
            raise APIError(429, f"server busy: {self.opts.max_queue} requests already waiting; retry later",
                           code="queue_full", headers={"Retry-After": str(self.opts.retry_after_s)})
        index = next(self._ids)
        r = Request(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:20]}", n, max_tokens, arrival,
                    prompt=text, prompt_token_ids=ids, index=index)
        try:
            self.engine.backend.prepare(r)
        except ValueError as e:
            raise APIError(400, str(e), "prompt") from None
        return r

    def _prompt(self, body, chat: bool) -> tuple[str, list[int] | None, int]:
        if chat:
            prompt = self.codec.chat_prompt([(m.role, m.text) for m in body.messages])
        else:
            prompt = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise APIError(400, "batched prompts are not supported: send one prompt per request", "prompt")
                prompt = prompt[0]
        if (isinstance(prompt, str) and not prompt.strip()) or (isinstance(prompt, list) and not prompt):
            raise APIError(400, "prompt must not be empty", "prompt")
        if isinstance(prompt, list) and self.codec.vocab and not all(0 <= t < self.codec.vocab for t in prompt):
            raise APIError(400, f"prompt token ids must be in 0..{self.codec.vocab - 1}", "prompt")
        ids, n = self.codec.encode(prompt)
        return (prompt if isinstance(prompt, str) else ""), ids, max(n, 1)

    # --- responses ----------------------------------------------------------------------------
    async def _events(self, s: Stream, include_usage: bool):
        r = s.request
        try:
            while True:
                await s.event.wait()
                s.event.clear()
                done = r.is_done                  # read before the count: once done, every stamp is in
                out = self._new_text(s)
                if out:
                    yield out
                if done:
                    break
            if r.status is Status.FAILED:
                yield s.chunks.error_event(r.error or "failed")
            elif include_usage:
                yield s.chunks.usage_event(usage(r), timing(r))
            yield DONE
        finally:
            self._forget(s)

    def _new_text(self, s: Stream) -> str:
        r = s.request
        n = r.output_len
        if n <= s.sent:
            return ""
        texts = self.codec.delta(r, s.sent, n, s.text_state)
        events = [s.chunks.delta(t, "length" if k == r.max_new_tokens - 1 else None)
                  for k, t in zip(range(s.sent, n), texts)]
        s.sent = n
        return "".join(events)

    async def _whole(self, s: Stream, http: HTTPRequest) -> Response:
        finished = asyncio.create_task(_until_done(s))
        gone = asyncio.create_task(_disconnected(http))
        try:
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished.cancel()
            gone.cancel()
            self._forget(s)
        r = s.request
        if not r.is_done:
            return Response(status_code=499)     # the client left; nobody reads this
        if r.status is Status.FAILED:
            raise APIError(500, r.error or "failed")
        text = "".join(self.codec.delta(r, 0, r.output_len, {}))
        return JSONResponse(s.chunks.full(text, usage(r)) | {"batchlab_timing": timing(r)})

    def _forget(self, s: Stream) -> None:
        self.streams.pop(s.request, None)
        if not s.request.is_done:
            self.engine.cancel(s.request)


async def _until_done(s: Stream) -> None:
    while not s.request.is_done:
        await s.event.wait()
        s.event.clear()


async def _disconnected(http: HTTPRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


def usage(r: Request) -> dict[str, int]:
    return {"prompt_tokens": r.prompt_len, "completion_tokens": r.output_len,
            "total_tokens": r.prompt_len + r.output_len}


def timing(r: Request) -> dict[str, float]:
    """The server's own stamps (perf_counter seconds: comparable with a client on the same machine
    only), so a client can split its latency into HTTP transit and time inside the server."""
    return {"arrival": r.arrival_time, "first_token": r.token_times[0], "last_token": r.token_times[-1]}


def create_app(server: Server, keep_alive: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        await server.start()
        yield
        await server.engine.stop()

    app = FastAPI(title="batchlab serve", lifespan=lifespan)
    app.add_middleware(StampArrival, clock=server.clock)
    if not keep_alive:
        app.add_middleware(CloseConnections)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        if exc.status < 500:                    # 5xx: the engine already counted the failure
            server.metrics.requests.labels("rejected" if exc.status == 429 else "invalid").inc()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return await api_error(request, APIError(400, message, param))

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: HTTPRequest):
        return await server.handle(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: HTTPRequest):
        return await server.handle(body, request)

    @app.get("/v1/models")
    async def models():
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "batchlab"}
                for name in server.opts.model_names]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health():
        if not server.engine.alive:
            return JSONResponse({"status": "error", "error": str(server.engine.error)}, status_code=503)
        return {"status": "ok", "queue_depth": server.queue_depth(), "running": server.engine.running_count()}

    @app.get("/metrics")
    async def metrics():
        peak = server.engine.backend.peak_memory()
        if peak:
            server.metrics.peak_memory.labels(peak["peak_mem_kind"]).set(peak["peak_mem_bytes"])
        return Response(server.metrics.render(), media_type=server.metrics.content_type)

    return app


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


def build_server(cfg: RunConfig, strategy: str, names: tuple[str, ...] = (), max_queue: int = 256,
                 max_model_len: int | None = None, default_max_tokens: int = 16,
                 engine_thread: bool = False, flush_idle_s: float | None = 1.0) -> Server:
    """The scheduler, backend and engine for `strategy` under `cfg`, not yet started."""
    from batchlab.bench.runner import make_backend
    from batchlab.schedulers import make_scheduler

    if strategy == "server" or strategy not in ("naive", "dynamic", "continuous"):
        raise ConfigError(f"--strategy must be naive, dynamic or continuous (got {strategy!r})")
    if cfg.backend.kind not in ("sim", "hf"):
        raise ConfigError(f"batchlab serve runs backend.kind sim or hf, not {cfg.backend.kind!r}")
    backend = make_backend(cfg)
    scheduler = make_scheduler(strategy, cfg, backend.memory_budget(),
                               backend.num_kv_blocks(cfg.continuous.block_size))
    if scheduler.level == "iteration" and not hasattr(backend, "step"):
        raise ConfigError(f"backend.kind {cfg.backend.kind!r} cannot run continuous batching")
    names = names or _default_names(cfg)
    opts = ServeOptions(tuple(names), max_queue, max_model_len, default_max_tokens, engine_thread=engine_thread,
                        flush_idle_s=flush_idle_s)
    return Server(Engine(scheduler, backend, RealClock(), flush_idle_s=flush_idle_s), opts)


def _loaded(backend) -> tuple[object | None, object | None]:
    """(model, tokenizer) of a loaded HF backend; (None, None) for the simulator."""
    loaded = getattr(backend, "loaded", None)
    return getattr(loaded, "model", None), getattr(loaded, "tokenizer", None)


def _default_names(cfg: RunConfig) -> tuple[str, ...]:
    if cfg.backend.kind == "sim":
        return (cfg.backend.preset,)
    name = cfg.backend.model or "tiny"
    return tuple(dict.fromkeys([name, Path(name).name]))


@click.command("serve")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--strategy", default="dynamic", show_default=True,
              type=click.Choice(["naive", "dynamic", "continuous"]), help="Batching policy.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model-name", "names", multiple=True, help="Served model name (repeatable; default: preset or model).")
@click.option("--max-queue", default=256, show_default=True, type=click.IntRange(min=1),
              help="Waiting requests before new ones get 429.")
@click.option("--max-model-len", default=None, type=click.IntRange(min=1), help="Context length (default: the model's).")
@click.option("--default-max-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--keep-alive/--no-keep-alive", default=True, show_default=True,
              help="Keep connections open between requests (off: for clients that reuse a pool across event loops).")
@click.option("--engine-thread", is_flag=True, help="Run the scheduler loop on its own thread.")
@click.option("--flush-idle-ms", default=1000.0, show_default=True, type=click.FloatRange(min=0),
              help="After this long without arrivals, partial batches run (naive would wait forever); 0: never.")
@click.option("--log-level", default="warning", show_default=True)
@user_errors
def serve_cmd(config, strategy, overrides, host, port, names, max_queue, max_model_len, default_max_tokens,
              keep_alive, engine_thread, flush_idle_ms, log_level) -> None:
    """Serve a batchlab scheduler + backend over the OpenAI API (simulator in real time, or HF)."""
    import uvicorn
    import yaml

    from batchlab.cli import default_config_text

    base = None if config else yaml.safe_load(default_config_text())
    cfg = load_config(config, list(overrides), base=base)
    server = build_server(cfg, strategy, tuple(names), max_queue, max_model_len, default_max_tokens, engine_thread,
                          flush_idle_ms / 1000 if flush_idle_ms > 0 else None)
    click.echo(f"batchlab serve: {strategy} over {cfg.backend.kind} as {', '.join(server.opts.model_names)} "
               f"on http://{host}:{port}/v1", err=True)
    # NOTE: the event loop shares the GIL with the backend's worker thread (forward passes); at
    # the default 5 ms switch interval a waking step or stream can wait that long. 0.5 ms keeps
    # hand-offs short.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    uvicorn.run(create_app(server, keep_alive), host=host, port=port, log_level=log_level, access_log=False)
