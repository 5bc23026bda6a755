"""An OpenAI-compatible server in miniature, behind httpx transports, for black-box profile tests.

One engine loop batches every request in flight: a step takes step_s + per_row_s per running
request + per_prompt_s per prompt token it computes, and every running request gets one token at
its end (a new one's first token at the end of the step holding its prompt). A request reaches the
engine frontend_s after it arrives; engine_per_token_s per prompt token of each new request is
work done on the engine's processor outside the step holding its prompt (the step after it is
that much longer): what a step model fitted from those steps cannot see. Switches make it
misbehave the ways real servers do: `behind_from_rows`, a front end that falls behind the engine
(two tokens a chunk) while that many rows run; `admit_per_step`, a scheduler that takes at most
that many waiting requests into a step; `gather_s`, how long an idle engine waits, once woken, for
the rest of a burst. With `step_histogram`, /metrics publishes each step's tokens
(prompt tokens computed plus one per request that got a token) as vLLM's iteration_tokens_total.
"""
from __future__ import annotations

import asyncio
import json

import httpx

STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)   # vLLM's, for tokens per step


class FakeServer:
    def __init__(self, step_s=0.003, per_row_s=0.0002, per_prompt_s=2e-5, frontend_s=0.002, *, engine_per_token_s=0.0,
                 usage=True, merge=1, refuse_eos=False, rate_limit=False, restart=False, vllm_config=None,
                 step_histogram=False, behind_from_rows=None, admit_per_step=None,
                 gather_s=0.0):
        self.step_s, self.per_row_s, self.per_prompt_s, self.frontend_s = step_s, per_row_s, per_prompt_s, frontend_s
        self.engine_per_token_s = engine_per_token_s
        self.usage, self.merge, self.refuse_eos, self.rate_limit, self.restart = usage, merge, refuse_eos, rate_limit, restart
        self.vllm_config = vllm_config          # what /server_info states (None: no such page, as without dev mode)
        self.started = 1_700_000_000.0
        self.step_histogram = step_histogram
        self.behind_from_rows, self.admit_per_step, self.gather_s = behind_from_rows, admit_per_step, gather_s
        self.step_sizes: list[int] = []         # every step's tokens, as vLLM counts them
        self.pending: list[dict] = []
        self.running: list[dict] = []
        self.wake: asyncio.Event | None = None
        self.loop_task: asyncio.Task | None = None

    # -- the sync side: models and metrics ---------------------------------------------------
    def sync_transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/models"):
                return httpx.Response(200, json={"data": [{"id": "fake"}]})
            if request.url.path == "/metrics":
                if self.restart:
                    self.started += 60.0         # a new process every time anyone looks
                text = (f'process_start_time_seconds {self.started}\n'
                        'vllm:cache_config_info{block_size="32",enable_prefix_caching="False",num_gpu_blocks="900"} 1.0\n')
                if self.step_histogram:
                    text += self._histogram()
                return httpx.Response(200, text=text)
            if request.url.path == "/server_info" and self.vllm_config is not None:
                return httpx.Response(200, json={"vllm_config": self.vllm_config, "vllm_env": {}})
            return httpx.Response(404)
        return httpx.MockTransport(handle)

    def _histogram(self) -> str:
        name = "vllm:iteration_tokens_total"
        lines = [f"# TYPE {name} histogram"]
        for le in (*STEP_BUCKETS, float("inf")):
            n = sum(size <= le for size in self.step_sizes)
            lines.append(f'{name}_bucket{{engine="0",le="{"+Inf" if le == float("inf") else f"{le:.1f}"}"}} {n}')
        lines += [f'{name}_count{{engine="0"}} {len(self.step_sizes)}', f'{name}_sum{{engine="0"}} {sum(self.step_sizes)}']
        return "\n".join(lines) + "\n"

    # -- the async side: streamed completions ------------------------------------------------
    def async_transport(self) -> httpx.MockTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            if self.rate_limit:
                return httpx.Response(429, json={"error": {"message": "rate limit exceeded"}})
            if self.refuse_eos and "ignore_eos" in body:
                return httpx.Response(422, json={"error": {"message": "ignore_eos is not supported"}})
            return httpx.Response(200, content=self._stream(body), headers={"content-type": "text/event-stream"})
        return httpx.MockTransport(handle)

    async def _stream(self, body: dict):
        job = {"prompt": len(body["prompt"]), "left": int(body["max_tokens"]), "queue": asyncio.Queue(), "computed": 0}
        await asyncio.sleep(self.frontend_s)
        self._ensure_engine()
        self.pending.append(job)
        self.wake.set()
        n, held = 0, 0
        while n < int(body["max_tokens"]):
            await job["queue"].get()
            n += 1
            held += 1
            behind = self.behind_from_rows is not None and len(self.running) >= self.behind_from_rows and n > 1
            if held == (2 if behind else self.merge) or n == int(body["max_tokens"]):
                yield self._chunk({"choices": [{"text": "x" * held, "index": 0}]})
                held = 0
        usage = {"prompt_tokens": job["prompt"], "completion_tokens": n}
        yield self._chunk({"choices": [], "usage": usage} if self.usage else {"choices": []})
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _chunk(obj: dict) -> bytes:
        return f"data: {json.dumps(obj)}\n\n".encode()

    def _ensure_engine(self) -> None:
        loop = asyncio.get_running_loop()
        if self.loop_task is None or self.loop_task.get_loop() is not loop or self.loop_task.done():
            self.wake = asyncio.Event()
            self.pending, self.running = [], []
            self.loop_task = loop.create_task(self._engine())

    async def _engine(self) -> None:
        while True:
            if not self.pending and not self.running:
                self.wake.clear()
                await self.wake.wait()
            if self.gather_s and not self.running:
                await asyncio.sleep(self.gather_s)
            take = len(self.pending) if self.admit_per_step is None else self.admit_per_step
            self.running += self.pending[:take]
            self.pending = self.pending[take:]
            prompts = sum(j["prompt"] for j in self.running if not j["computed"])
            after = sum(j["prompt"] for j in self.running if j["computed"] == 1)       # computed in the last step
            front = self.engine_per_token_s * after
            await asyncio.sleep(self.step_s + self.per_row_s * len(self.running) + self.per_prompt_s * prompts + front)
            self.step_sizes.append(prompts + len(self.running))
            for j in self.running:
                j["computed"] = j["computed"] + 1
                j["left"] -= 1
                j["queue"].put_nowait(1)
            self.running = [j for j in self.running if j["left"] > 0]
