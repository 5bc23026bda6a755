"""`batchlab serve`: an OpenAI-compatible HTTP server over any batchlab scheduler and backend.

FastAPI routes HTTP to the service (server/service.py: admission, streaming, cancellation);
the engine (server/engine.py) runs the same driver and scheduler as an offline sweep, so a
strategy behaves identically in-process and behind HTTP. This module wires them together:
routes, error handlers, /health, /metrics, and the `batchlab serve` command.
"""
from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path

import click
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from batchlab.core.clock import RealClock
from batchlab.core.config import RunConfig, load_user_config
from batchlab.errors import ConfigError, user_errors
from batchlab.server.engine import Engine
from batchlab.server.middleware import CloseConnections, StampArrival
from batchlab.server.protocol import APIError, ChatBody, CompletionBody, validation_message
from batchlab.server.service import ServeOptions, Server

SWITCH_INTERVAL_S = 0.0005


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


def build_server(cfg: RunConfig, strategy: str, names: tuple[str, ...] = (), max_queue: int = 256,
                 max_model_len: int | None = None, default_max_tokens: int = 16,
                 engine_thread: bool = False, flush_idle_s: float | None = 1.0) -> Server:
    """The scheduler, backend and engine for `strategy` under `cfg`, not yet started."""
    from batchlab.backends import make_backend
    from batchlab.schedulers import make_scheduler

    if strategy == "server" or strategy not in ("naive", "dynamic", "continuous"):
        raise ConfigError(f"--strategy must be naive, dynamic or continuous (got {strategy!r})")
    if cfg.backend.kind not in ("sim", "hf"):
        raise ConfigError(f"batchlab serve runs backend.kind sim or hf, not {cfg.backend.kind!r}")
    backend = make_backend(cfg)
    scheduler = make_scheduler(strategy, cfg, backend.memory_budget(),
                               backend.num_kv_blocks(cfg.continuous.block_size))
    if scheduler.level not in backend.levels:
        raise ConfigError(f"backend.kind {cfg.backend.kind!r} cannot run continuous batching")
    names = names or _default_names(cfg)
    opts = ServeOptions(tuple(names), max_queue, max_model_len, default_max_tokens, engine_thread=engine_thread,
                        flush_idle_s=flush_idle_s)
    return Server(Engine(scheduler, backend, RealClock(), flush_idle_s=flush_idle_s), opts)


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

    cfg = load_user_config(config, overrides)
    server = build_server(cfg, strategy, tuple(names), max_queue, max_model_len, default_max_tokens, engine_thread,
                          flush_idle_ms / 1000 if flush_idle_ms > 0 else None)
    click.echo(f"batchlab serve: {strategy} over {cfg.backend.kind} as {', '.join(server.opts.model_names)} "
               f"on http://{host}:{port}/v1", err=True)
    # NOTE: the event loop shares the GIL with the backend's worker thread (forward passes); at
    # the default 5 ms switch interval a waking step or stream can wait that long. 0.5 ms keeps
    # hand-offs short.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # NOTE: loop and http stay "auto": uvicorn then runs on uvloop and httptools, which the serve
    # extra installs (about 1 ms less TTFT than asyncio + h11 here: benchmarks/serving.py overhead).
    uvicorn.run(create_app(server, keep_alive), host=host, port=port, log_level=log_level, access_log=False)
