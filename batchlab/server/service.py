"""The HTTP side of `batchlab serve`: admit a request, stream its tokens, cancel it if the client goes.

A request is stamped on arrival, validated (400/404, OpenAI-style errors), refused with 429 +
Retry-After when `max_queue` requests already wait, then submitted to the engine. The engine
wakes the request's Stream whenever tokens were stamped on it; the stream reads the stamps and
writes them as server-sent events (or one JSON answer). A client that disconnects has its
request cancelled: dropped from the queue, or from the running set at the next step. From
the shutdown signal on (`draining`, then `drain`) new requests get 503 with Connection: close,
and what is still running at the deadline fails: its stream ends with an error event.
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from batchlab.core.request import Request, Status
from batchlab.schedulers import ContinuousScheduler
from batchlab.server.engine import Engine
from batchlab.server.metrics import ServerMetrics
from batchlab.server.protocol import DONE, APIError, ChatBody, Chunks, CompletionBody, unsupported
from batchlab.server.stream import EventStream
from batchlab.server.text import TextCodec

DRAIN_POLL_S = 0.02               # how often a draining server looks whether its streams have ended


@dataclass(frozen=True)
class ServeOptions:
    model_names: tuple[str, ...]      # names clients may ask for; the first is listed by /v1/models
    max_queue: int = 256              # requests waiting to be scheduled before new ones get 429
    max_model_len: int | None = None  # tokens of context: prompt + max_tokens must fit (None: the model's)
    default_max_tokens: int = 16      # when a request gives no max_tokens (OpenAI's default)
    retry_after_s: int = 1            # Retry-After header on 429
    engine_thread: bool = False       # run the driver on its own thread (for a backend that blocks the loop)
    flush_idle_s: float | None = 1.0  # seconds without arrivals before partial batches are flushed
    max_body_bytes: int = 1 << 20     # larger request bodies get 413 (--max-body-bytes)
    timeout_body_s: float = 60.0      # a body not complete this long after its headers gets 408 (--timeout-body)


@dataclass(eq=False)
class Stream:
    """A live request as the HTTP side sees it."""
    request: Request
    chunks: Chunks
    event: asyncio.Event
    sent: int = 0                     # output tokens already written to the client
    text_state: dict | None = None
    gone: bool = False                # the client disconnected


class Server:
    def __init__(self, engine: Engine, opts: ServeOptions):
        self.engine, self.opts = engine, opts
        self.codec = TextCodec()              # the backend's tokenizer once it has loaded (start)
        self.max_model_len = opts.max_model_len or 4096
        self.vocab: int | None = None         # prompt token ids must be below this (the engine's facts)
        self.draining = False                 # shutting down: new requests get 503
        self.clock = engine.clock
        self.streams: dict[Request, Stream] = {}
        self.metrics = ServerMetrics(self.queue_depth, lambda: engine.running_count())
        engine.on_batch = self.metrics.batch_size.observe
        engine.on_done = self.metrics.observe_done
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    def info(self) -> dict[str, Any]:
        """What this server runs with, for a client that profiles it: the strategy, the processor
        the model computes on (none for the simulator: its steps are waits), and for continuous
        batching its limits in the `continuous` section's names (a twin starts from them)."""
        sched, facts = self.engine.scheduler, self.engine.backend.describe()
        device = None if facts.get("backend") == "sim" else str(facts.get("device", "")).split(":")[0] or None
        out: dict[str, Any] = {"server": "batchlab", "strategy": sched.name, "device": device}
        if isinstance(sched, ContinuousScheduler):      # the blocks it runs with: the section's, or the backend's memory
            out["continuous"] = sched.cfg.model_dump(exclude={"preemption"}) | {"num_kv_blocks": sched.num_kv_blocks}
        return out

    def queue_depth(self) -> int:
        return self.engine.queued_count()

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        threaded = self.opts.engine_thread
        notify = (lambda reqs: loop.call_soon_threadsafe(self._wake, reqs)) if threaded else self._wake
        await self.engine.start(notify, threaded=threaded)
        backend = self.engine.backend
        facts = backend.facts()
        self.codec = TextCodec(backend.tokenizer())
        self.max_model_len = self.opts.max_model_len or facts.max_context or 4096
        self.vocab = facts.vocab_size
        self.engine.backend.reset_peak_memory()   # peaks are measured from here: loaded and warm
        # NOTE: the loaded model, tokenizer and libraries are a few hundred thousand objects that
        # live as long as the server. Frozen, the collector stops walking them on every full
        # collection: those walks were pauses of a few hundred milliseconds under load, the
        # engine stalled for each (vLLM freezes its heap after start-up for the same reason).
        gc.collect()
        gc.freeze()

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
            return EventStream(self._events(s, usage), on_gone=lambda: self._gone(s))
        return await self._whole(s, http)

    # --- admission --------------------------------------------------------------------------
    def _admit(self, body, chat: bool, arrival: float) -> Request:
        """Validate and build the request; raises APIError (4xx, 429, 503)."""
        if body.model not in self.opts.model_names:
            raise APIError(404, f"The model '{body.model}' does not exist; this server serves "
                                f"{', '.join(self.opts.model_names)}", "model", "model_not_found")
        if body.n != 1:
            raise APIError(400, "n must be 1 (one choice per request)", "n")
        refused = unsupported(body)
        if refused is not None:
            raise APIError(400, refused[1], refused[0], "unsupported_parameter")
        text, ids, n = self._prompt(body, chat)
        max_tokens = self._output_len(body, n)
        if self.draining:             # NOTE: Connection: close, so a client does not send its next request here
            raise APIError(503, "the server is shutting down", code="shutting_down", headers={"Connection": "close"})
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
            try:
                prompt = self.codec.chat_prompt([(m.role, m.text) for m in body.messages])
            except ValueError as e:
                raise APIError(400, str(e), "messages") from None
        else:
            prompt = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise APIError(400, "batched prompts are not supported: send one prompt per request", "prompt")
                prompt = prompt[0]
        if (isinstance(prompt, str) and not prompt.strip()) or (isinstance(prompt, list) and not prompt):
            raise APIError(400, "prompt must not be empty", "prompt")
        if isinstance(prompt, list) and self.vocab is not None and not all(0 <= t < self.vocab for t in prompt):
            raise APIError(400, f"prompt token ids must be in 0..{self.vocab - 1}", "prompt")
        ids, n = self.codec.encode(prompt)
        return (prompt if isinstance(prompt, str) else ""), ids, max(n, 1)

    def _output_len(self, body, prompt_len: int) -> int:
        """max_completion_tokens, else max_tokens, else the default; each must be at least 1 and fit
        the context with the prompt. NOTE: when both are given both are checked, so an invalid
        value never passes silently because the other one was used."""
        given = {k: v for k, v in (("max_tokens", body.max_tokens),
                                   ("max_completion_tokens", body.max_completion_tokens)) if v is not None}
        for key, value in (given or {"max_tokens": self.opts.default_max_tokens}).items():
            if value <= 0:
                raise APIError(400, f"{key} must be at least 1, got {value}", key)
            if prompt_len + value > self.max_model_len:
                raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens; "
                                    f"the request needs {prompt_len} prompt + {value} output tokens ({key})",
                               "prompt", "context_length_exceeded")
        return given.get("max_completion_tokens", given.get("max_tokens", self.opts.default_max_tokens))

    async def drain(self, deadline: float) -> None:
        """Shutdown: new requests get 503; requests in flight may finish until `deadline` (a clock
        reading); then the engine stops and the rest fail, their streams ending with an error event."""
        self.draining = True
        while self.streams and self.clock.now() < deadline:
            await self.clock.sleep(min(DRAIN_POLL_S, max(0.0, deadline - self.clock.now())))
        if self.streams:
            self.engine.abort("the server is shutting down")

    # --- responses ----------------------------------------------------------------------------
    def _gone(self, s: Stream) -> None:
        s.gone = True
        s.event.set()

    async def _events(self, s: Stream, include_usage: bool):
        r = s.request
        try:
            while True:
                await s.event.wait()
                s.event.clear()
                if s.gone:
                    return
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

    def _new_text(self, s: Stream) -> bytes:
        r = s.request
        n = r.output_len
        if n <= s.sent:
            return b""
        texts = self.codec.delta(r, s.sent, n, s.text_state)
        events = [s.chunks.delta(t, "length" if k == r.max_new_tokens - 1 else None)
                  for k, t in zip(range(s.sent, n), texts)]
        s.sent = n
        return b"".join(events)

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
        if r.status is Status.FAILED:            # NOTE: returned, not raised: the engine counted it
            return APIError(503 if self.draining else 500, r.error or "failed").response()
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
