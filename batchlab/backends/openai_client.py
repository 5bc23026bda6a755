"""The client of the `openai` kind: any OpenAI-compatible endpoint, measured from the client side.

Each request is sent at its planned arrival time to `/v1/completions` with streaming; every SSE
event is stamped through the clock as it is parsed (not once per network read: a read can hold
several events), and the exact token counts come from the final usage report (a chunk may carry
several tokens). The definitions match `vllm bench serve`: TTFT = first chunk with a choice, TPOT
= (last chunk - first chunk) / (tokens - 1), ITL = one gap per chunk (`chunk_itls`); token stamps
inside a multi-token chunk are spread evenly between chunk stamps (see `token_stamps`). The latency clock starts at the
*planned* arrival, so time lost in the load generator or waiting for a pooled connection counts
against the server's numbers, never in its favour; the generator's own send lag is recorded
(`point_facts()`) and a run where it is large is flagged; the send loop is LoadTarget's.
When each request began to be written to the socket is kept too (`sent_at`), so what the
client spends before a request leaves can be told apart from what the server adds.

NOTE: not the official `openai` client: one parsed JSON line per chunk costs far less CPU than its
pydantic objects (the load generator shares its cores with the server), and it may retry behind
our back. A plain http:// server is read through backends/sse_http.py (httptools on an asyncio
Protocol, events stamped inside the read callback); https:// and tests that fake a server with
`httpx.MockTransport` go through httpx. Both never retry, and their pool limits and timeouts are
explicit. Server tests use the official client.
Before a run, `preflight` asks the server's `/models` whether it serves the configured model, so
a wrong name fails in one line instead of in thousands of recorded requests. The API key comes
from the environment only, and is masked in every error text recorded.
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import orjson

from batchlab.backends import sse_http
from batchlab.backends.base import LoadTarget
from batchlab.core.breakdown import finish
from batchlab.core.clock import Clock
from batchlab.core.config import one_line
from batchlab.core.request import Request, Status
from batchlab.errors import ConfigError

MODELS_TIMEOUT_S = 5.0   # preflight: seconds the server has to answer GET /models
KEY_ENV = "OPENAI_API_KEY"   # where the API key is read from unless backend.api_key_env names another variable
LAG_WARN_S = 0.005       # send lag p99 above this flags the run: the load generator, not the server, was slow
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing".split()


class OpenAIBackend(LoadTarget):
    lead_s = 0.05            # the first planned arrival is this far after the start, so it can be on time

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", timeout_s: float = 600.0,
                 prompt_format: str = "tokens", length_control: str = "ignore_eos",
                 max_connections: int | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 client: str = "lean"):
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.prompt_format = prompt_format
        self.length_control = length_control
        self.max_connections = max_connections
        self.transport = transport               # tests inject httpx.MockTransport
        self.client = client                     # "lean" (sse_http, plain http:// only) or "httpx"
        self.salt = secrets.randbits(48)         # the synthetic prompts' salt: this process's, fresh again per session
        self.server_timing: dict[str, dict] = {}  # request id -> batchlab serve's own stamps, if sent
        self.sent_at: dict[str, float] = {}       # request id -> when the client began writing it to the socket
        self.started_at: dict[str, float] = {}    # request id -> when its send coroutine began (vLLM's start)
        self.chunk_times: dict[str, list[float]] = {}  # request id -> one stamp per chunk with a choice
        self.slots: asyncio.Semaphore | None = None     # the session's pool size: requests beyond it wait here

    def redact(self, text: str) -> str:
        """`text` with the API key masked (a server may quote the key it refused)."""
        return redact(text, self.api_key)

    def describe(self) -> dict[str, Any]:
        return {"backend": "openai", "model": self.model, "base_url": self.base_url,
                "prompt_format": self.prompt_format, "length_control": self.length_control,
                "client": "lean" if self.lean else f"httpx {httpx.__version__}"}

    def prepare(self, request: Request) -> None:
        if self.prompt_format == "tokens" and request.prompt_token_ids is None:
            request.prompt_token_ids = synthetic_token_ids(request.index, request.prompt_len, self.salt)
        elif self.prompt_format == "text" and not request.prompt:
            request.prompt = synthetic_text(request.index, request.prompt_len, self.salt)

    def session(self, concurrency: int) -> Any:
        """One client and pool for a run, sized for `concurrency` requests in flight. A run's
        synthetic prompts are its own (a fresh salt): a server's prefix cache never finds a prompt
        it saw in an earlier run, so a rerun of the same trace costs what the first run cost.
        A plain http:// server is read through the lean client (backends/sse_http.py: about a
        third of httpx's CPU per streamed request); https://, or an injected transport, through httpx."""
        self.server_timing, self.sent_at, self.started_at, self.chunk_times = {}, {}, {}, {}
        self.salt = secrets.randbits(48)
        size = self.max_connections or max(1, min(concurrency, 1024))
        # NOTE: requests beyond the pool wait here, not in httpcore's pool, whose queue is scanned
        # against every connection on each event: with 2,400 requests in flight behind 1,024
        # connections that took the client minutes of CPU after the server had drained
        self.slots = asyncio.Semaphore(size)
        headers = {"Authorization": f"Bearer {self.api_key}"}
        if self.lean:
            return sse_http.Pool(self.base_url, headers, self.timeout_s)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        timeout = httpx.Timeout(self.timeout_s)            # connect, read, write and pool waits alike
        return httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=timeout,
                                 headers=headers, transport=self.transport)

    @property
    def lean(self) -> bool:
        """Whether requests go through the lean client (plain http://, no injected transport)."""
        return self.client == "lean" and self.transport is None and self.base_url.startswith("http://")

    def point_facts(self, measured_from: float, summary: dict[str, Any]) -> dict[str, Any]:
        """The load generator's own timing error over the last run (see module docstring), and
        its processes if it had several."""
        return send_lag_summary(self.send_lags) | self.split_facts

    RECORDS = ("server_timing", "sent_at", "started_at", "chunk_times")

    def worker_spec(self) -> tuple[type, dict[str, Any]]:
        # NOTE: the client only, whatever subclass started a server: a process sends, it never manages
        return OpenAIBackend, {"base_url": self.base_url, "model": self.model, "api_key": self.api_key,
                            "timeout_s": self.timeout_s, "prompt_format": self.prompt_format,
                            "length_control": self.length_control, "max_connections": self.max_connections,
                            "client": self.client}

    def records(self) -> dict[str, dict]:
        return {name: getattr(self, name) for name in self.RECORDS}

    def absorb(self, records: list[dict[str, dict]]) -> None:
        for name in self.RECORDS:
            setattr(self, name, {k: v for r in records for k, v in r[name].items()})

    def chunk_stamps(self, request: Request) -> list[float]:
        """One stamp per streamed chunk that carried a choice, as parsed."""
        return list(self.chunk_times.get(request.request_id, ()))

    async def send(self, r: Request, client: Any, clock: Clock) -> None:
        """One streamed request: stamps chunks on `r`, records failures on `r`; never raises.
        Waits for a free connection of the session's pool first (the wait is part of its latency:
        its clock started at its planned arrival)."""
        run = self._send_lean if isinstance(client, sse_http.Pool) else self._send
        if self.slots is None:
            return await run(r, client, clock)
        async with self.slots:
            await run(r, client, clock)

    async def _send_lean(self, r: Request, pool: sse_http.Pool, clock: Clock) -> None:
        """`_send` through the lean client: each SSE event is stamped and parsed inside the
        connection's read callback, the moment its bytes have been parsed."""
        r.status = Status.RUNNING
        rid = r.request_id
        self.started_at[rid] = clock.now()
        events = Events(clock.now)

        def on_sent() -> None:
            self.sent_at[rid] = clock.now()

        try:
            answer = await pool.post_sse("/completions", orjson.dumps(self.body(r)), events.feed, on_sent)
        except sse_http.HTTPFailure as e:
            r.fail(self.redact(f"timeout after {self.timeout_s:g} s ({e.kind})" if "Timeout" in e.kind else str(e)))
            return
        except (json.JSONDecodeError, ServerError) as e:
            r.fail(self.redact(f"{type(e).__name__}: {e}"))
            return
        if answer.status != 200:
            r.fail(self.redact(f"HTTP {answer.status}: {error_text(b''.join(answer.error_body))}"))
            return
        self._settle(r, events)

    async def _send(self, r: Request, client: httpx.AsyncClient, clock: Clock) -> None:
        r.status = Status.RUNNING
        self.started_at[r.request_id] = clock.now()   # where vllm bench serve starts its clock (st)
        events = Events(clock.now)

        async def trace(event: str, info: dict) -> None:      # httpcore's hook; MockTransport never calls it
            if event == "http11.send_request_headers.started":
                self.sent_at[r.request_id] = clock.now()

        try:
            async with client.stream("POST", "/completions", json=self.body(r),
                                     extensions={"trace": trace}) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    r.fail(self.redact(f"HTTP {resp.status_code}: {error_message(resp)}"))
                    return
                await read_stream(resp, events)
        except httpx.TimeoutException as e:
            r.fail(f"timeout after {self.timeout_s:g} s ({type(e).__name__})")
            return
        except (httpx.HTTPError, json.JSONDecodeError, ServerError) as e:
            r.fail(self.redact(f"{type(e).__name__}: {e}"))
            return
        self._settle(r, events)

    def _settle(self, r: Request, events: Events) -> None:
        """A whole answer: batchlab serve's own stamps kept aside, chunk stamps kept, tokens stamped."""
        usage = events.usage
        if usage and "batchlab_timing" in usage:
            self.server_timing[r.request_id] = usage.pop("batchlab_timing")
        self.chunk_times[r.request_id] = [t for t, _ in events.chunks]
        settle(r, events.chunks, usage)

    def body(self, r: Request) -> dict[str, Any]:
        prompt = r.prompt_token_ids if self.prompt_format == "tokens" else r.prompt
        body = {"model": self.model, "prompt": prompt, "max_tokens": r.max_new_tokens, "stream": True,
                "temperature": 0.0, "stream_options": {"include_usage": True}}
        if self.length_control == "ignore_eos":
            body |= {"ignore_eos": True, "min_tokens": r.max_new_tokens}
        elif self.length_control == "generation_config":
            # NOTE: transformers serve rejects ignore_eos/min_tokens (HTTP 422); EOS is switched off
            # through its own field, identical on every request (its continuous batching needs that).
            body["generation_config"] = json.dumps({"eos_token_id": -1, "do_sample": False})
        return body


class ServerError(RuntimeError):
    """The server reported an error inside the stream."""


class Events:
    """One answer's SSE events as they are parsed: each chunk's stamp and text, and the usage
    report. `feed` takes one event's data (both clients call it, once per event)."""

    __slots__ = ("now", "chunks", "usage")

    def __init__(self, now: Callable[[], float]):
        self.now = now
        self.chunks: list[tuple[float, str]] = []
        self.usage: dict | None = None

    def feed(self, data: bytes) -> bool:
        """Stamp and keep one event (the stamp is taken once its JSON is parsed); True at [DONE]."""
        if data == b"[DONE]":
            return True
        self.usage = read_chunk(orjson.loads(data), self.now(), self.chunks) or self.usage
        return False


async def read_stream(resp: httpx.Response, events: Events) -> None:
    """Read SSE events as bytes arrive; each event is stamped when it has been parsed.
    NOTE: a network read can hold several events (the server wrote them together); one stamp per
    read gave them all the read's time, hence zero gaps. Stamping each event after its JSON is
    parsed is what vLLM's bench client does (perf_counter after json.loads, per message), so the
    two clients' chunk gaps mean the same thing. Raw bytes are split by hand: cheaper per chunk
    than httpx's text and line decoders, and the load generator shares its CPU with the server."""
    buf = b""
    async for raw in resp.aiter_bytes():
        *lines, buf = (buf + raw).split(b"\n")
        for line in lines:
            if line.startswith(b"data:") and events.feed(line[5:].strip()):
                return


def read_chunk(chunk: dict, now: float, chunks: list[tuple[float, str]]) -> dict | None:
    """Stamp one parsed SSE chunk; returns its usage report, if it carries one."""
    if chunk.get("error"):
        raise ServerError(str(chunk["error"].get("message", chunk["error"])))
    choices = chunk.get("choices") or []
    if choices:
        c = choices[0]
        chunks.append((now, c.get("text") or (c.get("delta") or {}).get("content") or ""))
    usage = chunk.get("usage")
    if usage is not None and "batchlab_timing" in chunk:      # batchlab serve's own stamps
        usage = usage | {"batchlab_timing": chunk["batchlab_timing"]}
    return usage


def settle(r: Request, chunks: list[tuple[float, str]], usage: dict | None) -> None:
    """Turn stamped chunks plus the usage report into exactly one stamp per output token."""
    r.output_text = "".join(text for _, text in chunks)
    if not usage or "completion_tokens" not in usage:
        r.fail("stream ended without a usage report (exact token counts unknown)")
        return
    if usage.get("prompt_tokens"):
        r.prompt_len = int(usage["prompt_tokens"])        # exact, e.g. for text prompts
    r.token_times = token_stamps(chunks, int(usage["completion_tokens"]))
    finish(r)


def token_stamps(chunks: list[tuple[float, str]], n: int) -> list[float]:
    """n token stamps from the chunk stamps.

    One chunk per token is the usual case. Chunks with no text (a closing chunk that only carries
    finish_reason) are dropped when that makes the counts agree. If the server packed several
    tokens into fewer chunks, the first and last token keep the first and last chunk's stamps
    (TTFT, TPOT and E2E stay exact) and the tokens between are spread evenly along the chunk
    stamps, as if every chunk carried the same number of tokens.
    NOTE: the stream does not say how many tokens each chunk carried, so in-chunk stamps are an
    estimate either way; repeating a chunk's stamp (as before) put zero gaps into ITL and biased
    it low. vLLM's ITL (one gap per chunk) is exact: `chunk_itls` on the recorded chunk stamps."""
    every = [t for t, _ in chunks]
    content = [t for t, text in chunks if text]
    if len(every) == n or n == 0:
        return every[:n]
    if len(content) == n:
        return content
    stamps = every if len(every) > n else content or every
    if len(stamps) >= n or len(stamps) <= 1:
        return (stamps[:n] + stamps[-1:] * (n - len(stamps)))[:n] if stamps else []
    at = np.linspace(0.0, len(stamps) - 1, n)           # token k's position along the chunks
    return [float(t) for t in np.interp(at, np.arange(len(stamps)), stamps)]


def chunk_itls(chunk_times: list[float]) -> list[float]:
    """vLLM bench serve's ITL for one request: the gap before every chunk after the first."""
    return [b - a for a, b in zip(chunk_times, chunk_times[1:])]


def error_message(resp: httpx.Response) -> str:
    return error_text(resp.content)


def error_text(raw: bytes) -> str:
    """One line from an error answer's body: its JSON error message, else its text."""
    try:
        err = json.loads(raw)
        if isinstance(err, dict):
            detail = err.get("error", err.get("detail", err))
            return one_line(str(detail.get("message", detail) if isinstance(detail, dict) else detail)[:300])
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    return one_line(raw.decode("utf-8", "replace")[:300])


def send_lag_summary(lags: list[float]) -> dict[str, Any]:
    if not lags:
        return {}
    a = np.asarray(lags)
    p99 = float(np.percentile(a, 99))
    return {"send_lag_p50": float(np.percentile(a, 50)), "send_lag_p99": p99, "send_lag_max": float(a.max()),
            "send_lag_flag": bool(p99 > LAG_WARN_S)}


def synthetic_token_ids(index: int, n: int, salt: int = 0) -> list[int]:
    """A prompt of exactly n token ids drawn from ids 100..1099 (any vocabulary of the tiny model or
    larger has them), fixed by (salt, index) and unrelated to any other pair's: two requests share
    no prefix, so a prefix cache finds nothing it was not given on purpose."""
    return (100 + np.random.default_rng([salt, index]).integers(0, 1000, n)).tolist()


def synthetic_text(index: int, n: int, salt: int = 0) -> str:
    """About n tokens of plain words, starting at a place fixed by (salt, index); the server's
    usage report gives the exact count."""
    start = int(np.random.default_rng([salt, index]).integers(0, len(WORDS)))
    return " ".join(WORDS[(start + k) % len(WORDS)] for k in range(n))


def redact(text: str, key: str | None) -> str:
    if key and key != "EMPTY" and len(key) >= 4:
        text = text.replace(key, "***")
    return text


def api_key(env_name: str | None = None, setting: str = "backend.api_key_env") -> str:
    """The API key, from the environment only: the variable `env_name` (named by `setting`),
    else OPENAI_API_KEY, else "EMPTY" (what servers without authentication expect)."""
    if env_name:
        key = os.environ.get(env_name, "").strip()
        if not key:
            raise ConfigError(f"{setting}: the environment variable {env_name} is not set")
        return key
    return os.environ.get(KEY_ENV, "").strip() or "EMPTY"


def served_models(base_url: str, key: str = "EMPTY", transport: httpx.BaseTransport | None = None,
                  timeout_s: float = MODELS_TIMEOUT_S) -> list[str] | str:
    """The model ids GET {base_url}/models lists; a string (why) if it answered without a list.
    A server that does not answer, or refuses the key, is a ConfigError."""
    url = base_url.rstrip("/") + "/models"
    try:
        with httpx.Client(timeout=timeout_s, transport=transport, headers={"Authorization": f"Bearer {key}"}) as client:
            resp = client.get(url)
    except httpx.TimeoutException:
        raise ConfigError(f"backend.base_url: {url} did not answer within {timeout_s:g} s") from None
    except httpx.HTTPError as e:
        raise ConfigError(redact(f"backend.base_url: cannot reach {url} ({type(e).__name__}: {e}); "
                                 "is the server running?", key)) from None
    if resp.status_code in (401, 403):
        raise ConfigError(redact(f"{url}: HTTP {resp.status_code}: {error_message(resp)} (the API key is read from "
                                 f"{KEY_ENV}, or the variable backend.api_key_env names)", key))
    if resp.status_code != 200:
        detail = error_message(resp)
        return redact(f"HTTP {resp.status_code}" + (f": {detail}" if detail else ""), key)
    try:
        ids = [str(m["id"]) for m in resp.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return "the answer is not a model list"
    return ids


def check_server(base_url: str, model: str | None, key: str = "EMPTY",
                 transport: httpx.BaseTransport | None = None, timeout_s: float = MODELS_TIMEOUT_S) -> list[str]:
    """Refuse (ConfigError, one line) a server that does not answer or does not serve `model`,
    naming the models it does serve; returns warning lines (e.g. it cannot list its models)."""
    served = served_models(base_url, key, transport, timeout_s)
    if isinstance(served, str):
        return [f"cannot list the models at {base_url}/models ({served}); backend.model {model!r} is unchecked"]
    listed = ", ".join(served[:10]) + (f" and {len(served) - 10} more" if len(served) > 10 else "")
    if not model:
        raise ConfigError(f"backend.kind 'openai' needs backend.model; {base_url} serves: {listed or 'nothing'}")
    if model not in served:
        raise ConfigError(f"backend.model {model!r} is not served at {base_url}; it serves: {listed or 'nothing'}")
    return []


def server_metrics(base_url: str, key: str = "EMPTY", transport: httpx.BaseTransport | None = None,
                   timeout_s: float = MODELS_TIMEOUT_S) -> dict[str, Any]:
    """What a server publishes about itself on its Prometheus /metrics page (beside /v1): the
    labels of a `*cache_config_info` series (vLLM: block_size, num_gpu_blocks, enable_prefix_caching,
    ...) and `process_start_time_seconds`. {} if it has no such page."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        with httpx.Client(timeout=timeout_s, transport=transport, headers={"Authorization": f"Bearer {key}"}) as client:
            resp = client.get(url)
    except httpx.HTTPError:
        return {}
    return parse_metrics(resp.text) if resp.status_code == 200 else {}


GIB = 1 << 30


def server_config(base_url: str, key: str = "EMPTY", transport: httpx.BaseTransport | None = None,
                  timeout_s: float = 60.0) -> dict[str, Any]:
    """The scheduler and cache limits a server says it runs with, from its /server_info page,
    named as the `continuous` section names them: vLLM's config (`parse_server_config`; vLLM serves
    that page only in its development mode, VLLM_SERVER_DEV_MODE=1, which `batchlab vllm up` sets)
    or `batchlab serve`'s own (already in those names, with "server": "batchlab"); {} where absent.
    NOTE: a long timeout: vLLM's first answer gathers its system info (seconds of subprocesses)."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/server_info"
    try:
        with httpx.Client(timeout=timeout_s, transport=transport, headers={"Authorization": f"Bearer {key}"}) as client:
            resp = client.get(url, params={"config_format": "json"})
        page = resp.json() if resp.status_code == 200 else {}
        if isinstance(page, dict) and page.get("server") == "batchlab":
            return {"server": "batchlab", "device": page.get("device")} | dict(page.get("continuous") or {})
        config = page["vllm_config"] if page else {}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return {}
    return parse_server_config(config)


def parse_server_config(config: Any) -> dict[str, Any]:
    """vLLM's config (as JSON) in the continuous section's names: max_num_seqs,
    max_num_batched_tokens, chunk_size (chunked prefill: its per-request cap,
    long_prefill_token_threshold, or else the whole token budget; None when off), block_size,
    num_kv_blocks, prefix_caching, and kv_cache_gib; and the device the model runs on. What it
    does not state is left out."""
    sched, cache = ((config.get(k) if isinstance(config, dict) else None) for k in ("scheduler_config", "cache_config"))
    sched, cache = (x if isinstance(x, dict) else {} for x in (sched, cache))
    names = [(sched, "max_num_seqs", "max_num_seqs"), (sched, "max_num_batched_tokens", "max_num_batched_tokens"),
             (cache, "block_size", "block_size"), (cache, "num_kv_blocks", "num_gpu_blocks"),
             (cache, "prefix_caching", "enable_prefix_caching")]
    out = {ours: section[theirs] for section, ours, theirs in names if section.get(theirs) is not None}
    if sched.get("enable_chunked_prefill") is not None:
        cap = sched.get("long_prefill_token_threshold") or sched.get("max_num_batched_tokens")
        out["chunk_size"] = cap if sched["enable_chunked_prefill"] else None
    if cache.get("kv_cache_memory_bytes"):
        out["kv_cache_gib"] = cache["kv_cache_memory_bytes"] / GIB
    device = config.get("device_config") if isinstance(config, dict) else None
    if isinstance(device, dict) and isinstance(device.get("device"), str):
        out["device"] = device["device"]             # what the model runs on: "cpu", "cuda", ...
    return out


def parse_metrics(text: str) -> dict[str, Any]:
    """The cache geometry labels and process start time in a Prometheus text page."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        if name.endswith("cache_config_info") and "}" in rest:
            labels = rest.split("}", 1)[0]
            out |= {k.strip(): v.strip('"') for k, _, v in (kv.partition("=") for kv in _split_labels(labels)) if k}
        elif line.startswith("process_start_time_seconds "):
            out["process_start_time_seconds"] = float(line.split()[1])
    return out


def _split_labels(labels: str) -> list[str]:
    """`a="1",b="x,y"` -> ['a="1"', 'b="x,y"'] (commas inside quotes kept)."""
    parts, cur, quoted = [], "", False
    for ch in labels:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur] if cur else parts

