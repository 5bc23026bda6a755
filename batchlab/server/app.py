"""`batchlab serve`: an OpenAI-compatible HTTP server over any batchlab scheduler and backend.

FastAPI routes HTTP to the service (server/service.py: admission, streaming, cancellation);
the engine (server/engine.py) runs the same driver and scheduler as an offline sweep, so a
strategy behaves identically in-process and behind HTTP. This module wires them together:
routes, error handlers, /health, /metrics, and the `batchlab serve` command. Every error leaves
in OpenAI's shape, Starlette's own (unknown path, wrong method, body too large) included, and
every refusal is counted in /metrics; /openapi.json states the running server's limits
(server/schema.py).
"""
from __future__ import annotations

import math
import sys
from contextlib import asynccontextmanager

import click
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchlab.backends import make_backend
from batchlab.core.clock import RealClock
from batchlab.core.config import RunConfig
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_user_config
from batchlab.run.sweep import preflight
from batchlab.schedulers import SCHEDULERS
from batchlab.server.engine import Engine
from batchlab.server.middleware import CloseConnections, LimitBody, StampArrival, TooManyConnections
from batchlab.server.protocol import APIError, ChatBody, CompletionBody, validation_message
from batchlab.server.schema import openapi
from batchlab.server.service import ServeOptions, Server

SWITCH_INTERVAL_S = 0.0005
ENDPOINTS = ("POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "GET /health",
             "GET /metrics", "GET /server_info", "GET /openapi.json")


def create_app(server: Server, keep_alive: bool = True, limit_concurrency: int | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        await server.start()
        yield
        await server.engine.stop()

    app = FastAPI(title="batchlab serve", lifespan=lifespan)
    # add_middleware puts each one outside the ones before it: StampArrival is outermost.
    refused = server.metrics.observe_refusal
    app.add_middleware(LimitBody, max_bytes=server.opts.max_body_bytes, on_refuse=refused,
                       timeout_s=server.opts.timeout_body_s)
    app.add_middleware(TooManyConnections, limit=limit_concurrency, on_refuse=refused)
    if not keep_alive:
        app.add_middleware(CloseConnections)
    app.add_middleware(StampArrival, clock=server.clock)
    app.openapi = lambda: openapi(app, server.opts.model_names, server.vocab, server.max_model_len)
    errors(app, server)
    routes(app, server)
    return app


def errors(app: FastAPI, server: Server) -> None:
    """Every failure answered in the OpenAI error shape, each refusal counted."""
    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        server.metrics.observe_refusal(exc.status)     # NOTE: a request that failed in the engine is
        return exc.response()                           # answered, not raised (the engine counted it)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return await api_error(request, APIError(400, message, param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        """Starlette's own refusals (unknown path, wrong method, unreadable body, LimitBody's 413)."""
        return await api_error(request, refusal(request.method, request.url.path, exc))

    @app.exception_handler(Exception)
    async def crashed(request, exc: Exception):
        # NOTE: a bug, not a refusal; the traceback goes to the server log (Starlette re-raises it).
        return APIError(500, f"internal server error: {type(exc).__name__}").response()


def routes(app: FastAPI, server: Server) -> None:
    """The OpenAI endpoints, health and Prometheus metrics."""
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
        if server.draining or not server.engine.alive:
            why = "shutting down" if server.draining else str(server.engine.error or server.engine.aborted or "stopped")
            return JSONResponse({"status": "error", "error": why}, status_code=503,
                                headers={"Connection": "close"} if server.draining else None)
        return {"status": "ok", "queue_depth": server.queue_depth(), "running": server.engine.running_count()}

    @app.get("/server_info")
    async def server_info():
        return server.info()

    @app.get("/metrics")
    async def metrics():
        peak = server.engine.backend.peak_memory()
        if peak:
            server.metrics.peak_memory.labels(peak["peak_mem_kind"]).set(peak["peak_mem_bytes"])
        return Response(server.metrics.render(), media_type=server.metrics.content_type)


def refusal(method: str, path: str, exc: StarletteHTTPException) -> APIError:
    """Starlette's HTTPException as an OpenAI-style error with a message that says what to do."""
    status = exc.status_code
    if status == 404:
        return APIError(404, f"no such endpoint: {path} (this server answers {', '.join(ENDPOINTS)})",
                        code="unknown_url")
    if status == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        return APIError(405, f"{method} is not allowed on {path} (allowed: {allowed})", code="method_not_allowed",
                        headers=exc.headers)
    code = {408: "request_timeout", 413: "request_too_large"}.get(status)
    return APIError(status, str(exc.detail), code=code, headers=exc.headers)


def build_server(cfg: RunConfig, strategy: str, names: tuple[str, ...] = (), max_queue: int = 256,
                 max_model_len: int | None = None, default_max_tokens: int = 16,
                 engine_thread: bool = False, flush_idle_s: float | None = 1.0,
                 max_body_bytes: int = 1 << 20, timeout_body_s: float = 60.0) -> Server:
    """The scheduler, backend and engine for `strategy` under `cfg`, not yet started."""
    from batchlab.backends import ENGINE
    from batchlab.run.driver import given
    from batchlab.schedulers import SCHEDULERS, make_scheduler

    if strategy not in SCHEDULERS:
        raise ConfigError(f"--strategy must be one of {', '.join(SCHEDULERS)} (got {strategy!r})")
    if cfg.backend.role != ENGINE:
        raise ConfigError(f"batchlab serve drives an engine (backend.kind sim or hf), not {cfg.backend.kind!r}, "
                          "which batches for itself")
    if max_model_len is not None and default_max_tokens >= max_model_len:
        raise ConfigError(f"--default-max-tokens ({default_max_tokens}) must be below --max-model-len "
                          f"({max_model_len}): a prompt needs at least one token")
    backend = make_backend(cfg)
    facts = backend.facts()
    scheduler = make_scheduler(strategy, cfg, given(cfg, facts, live=True))
    if scheduler.level not in facts.levels:
        raise ConfigError(f"backend.kind {cfg.backend.kind!r} cannot run {scheduler.level}-level batching")
    names = names or cfg.backend.model_names()
    opts = ServeOptions(tuple(names), max_queue, max_model_len, default_max_tokens, engine_thread=engine_thread,
                        flush_idle_s=flush_idle_s, max_body_bytes=max_body_bytes, timeout_body_s=timeout_body_s)
    return Server(Engine(scheduler, backend, RealClock(), flush_idle_s=flush_idle_s), opts)


class OneLineUsageErrors(click.Command):
    """A bad option (`--port 99999`, `--max-queue 0`) is one `error:` line and exit status 2, like
    every other user mistake, rather than click's usage block."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            click.echo(f"error: {e.format_message()}", err=True)
            ctx.exit(2)


LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]


@click.command("serve", cls=OneLineUsageErrors)
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--strategy", default="dynamic", show_default=True,
              type=click.Choice(list(SCHEDULERS)), help="Batching policy.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port; 0: any free port (the banner names it).")
@click.option("--model-name", "names", multiple=True, help="Served model name (repeatable; default: preset or model).")
@click.option("--max-queue", default=256, show_default=True, type=click.IntRange(min=1),
              help="Waiting requests before new ones get 429.")
@click.option("--max-model-len", default=None, type=click.IntRange(min=2), help="Context length (default: the model's).")
@click.option("--default-max-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--max-body-bytes", default=1 << 20, show_default=True, type=click.IntRange(min=1),
              help="Larger request bodies get 413 without being read.")
@click.option("--shutdown-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds from SIGTERM/SIGINT to exit. From the signal on, new requests get 503; those in flight "
                   "may finish until shortly before the timeout, then end with an error. A second signal exits at once.")
@click.option("--timeout-keep-alive", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a connection may sit idle, before its first request or between two, before it is closed "
                   "(uvicorn's and vLLM's default).")
@click.option("--timeout-header", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds from a request's first byte to the end of its headers; slower gets 408 and is closed "
                   "(nginx's and Node's default).")
@click.option("--timeout-body", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds from a request's headers to the end of its body; slower (or a body shorter than its "
                   "Content-Length) gets 408 and is closed.")
@click.option("--limit-concurrency", default=None, type=click.IntRange(min=1), show_default="no limit",
              help="Connections open at once; a request on one more gets 503 (unlimited, as uvicorn and vLLM).")
@click.option("--keep-alive/--no-keep-alive", default=True, show_default=True,
              help="Keep connections open between requests (off: for clients that reuse a pool across event loops).")
@click.option("--engine-thread", is_flag=True, help="Run the scheduler loop on its own thread.")
@click.option("--flush-idle-ms", default=1000.0, show_default=True, type=click.FloatRange(min=0),
              help="After this long without arrivals, partial batches run (naive would wait forever); 0: never.")
@click.option("--log-level", default="warning", show_default=True, type=click.Choice(LOG_LEVELS))
@user_errors
def serve_cmd(config, strategy, overrides, host, port, names, max_queue, max_model_len, default_max_tokens,
              max_body_bytes, shutdown_timeout, timeout_keep_alive, timeout_header, timeout_body, limit_concurrency,
              keep_alive, engine_thread, flush_idle_ms, log_level) -> None:
    """Serve a batchlab scheduler + backend over the OpenAI API (simulator in real time, or HF)."""
    from batchlab.server.connection import Limits
    from batchlab.server.process import listen

    for name, value in (("--flush-idle-ms", flush_idle_ms), ("--shutdown-timeout", shutdown_timeout),
                        ("--timeout-keep-alive", timeout_keep_alive), ("--timeout-header", timeout_header),
                        ("--timeout-body", timeout_body)):
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number (got {value})")
    cfg = load_user_config(config, overrides)
    for line in preflight(cfg):         # a model path or preset that cannot work ends here, in one line
        click.echo(f"warning: {line}", err=True)
    server = build_server(cfg, strategy, tuple(names), max_queue, max_model_len, default_max_tokens, engine_thread,
                          flush_idle_ms / 1000 if flush_idle_ms > 0 else None, max_body_bytes, timeout_body)
    sock = listen(host, port)           # before anything starts: a port in use is an error line, not a hang
    banner = (f"{strategy} over {cfg.backend.kind} as {', '.join(server.opts.model_names)} "
              f"on http://{host}:{sock.getsockname()[1]}/v1")
    limits = Limits(timeout_keep_alive, timeout_header, limit_concurrency)
    _serve(server, sock, banner, limits, keep_alive=keep_alive, shutdown_timeout=shutdown_timeout, log_level=log_level)


def uvicorn_config(app: FastAPI, limits, shutdown_timeout: float = 10.0, log_level: str = "warning", **kw):
    """uvicorn's Config for `app` under `limits` (server/connection.py), as `batchlab serve` runs it.
    NOTE: the loop stays "auto" (uvloop) and the protocol is uvicorn's httptools one with the limits
    added; the serve extra installs both (about 1 ms less TTFT than asyncio + h11 here:
    benchmarks/serving.py overhead)."""
    import uvicorn

    from batchlab.server.connection import protocol_for
    from batchlab.server.process import flush_s

    # NOTE: uvicorn's shutdown starts once the drain has ended the streams; what it still waits
    # for (a slow client's body) gets the part of the timeout kept for flushing
    return uvicorn.Config(app, log_level=log_level, access_log=False, http=protocol_for(limits),
                          timeout_keep_alive=limits.timeout_keep_alive,
                          timeout_graceful_shutdown=max(flush_s(shutdown_timeout), 0.1), **kw)


def _serve(server: Server, sock, banner: str, limits, keep_alive: bool, shutdown_timeout: float,
           log_level: str) -> None:
    from batchlab.server.process import GracefulServer

    # NOTE: the event loop shares the GIL with the backend's worker thread (forward passes); at
    # the default 5 ms switch interval a waking step or stream can wait that long. 0.5 ms keeps
    # hand-offs short.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app = create_app(server, keep_alive, limits.limit_concurrency)
    uv = uvicorn_config(app, limits, shutdown_timeout, log_level)
    try:
        GracefulServer(uv, server, shutdown_timeout, banner).run(sockets=[sock])
    except KeyboardInterrupt:           # uvicorn re-raises the SIGINT it shut down for
        sys.exit(130)
