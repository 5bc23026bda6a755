"""transformers' own continuous batching as a load target (`backend.kind: hf-cb`, strategy `server`).

The library batches for itself: its manager (`model.init_continuous_batching()`) runs a generation
thread with a paged KV cache and its own FIFO scheduler. LoadTarget's send loop submits each
request at its planned arrival time (`add_request`); tokens stream back into result handlers. Stamps are the manager's
own per-token timestamps (`record_timestamps`), read from `time.perf_counter` in its thread right
after each token exists: the RealClock's time base, so they compare directly with our engine's.
Same budgets as our continuous scheduler: `num_blocks` x `page_size` (= continuous.block_size)
tokens of KV, always set (on CPU transformers cannot size the cache), `max_num_seqs` rows and
`max_num_batched_tokens` per step. EOS is off (`eos_token_id=-1`), so lengths are exact.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import torch

from batchlab.backends import hf_common as hc
from batchlab.backends import torch_thread
from batchlab.backends.base import LoadTarget
from batchlab.core.breakdown import finish
from batchlab.core.clock import Clock, RealClock
from batchlab.core.request import Request

WARMUP = (8, 16, 8)                # warm-up round: requests, prompt tokens, new tokens


class HFCBBackend(LoadTarget):
    def __init__(self, backend_cfg, cont, loaded: hc.Loaded | None = None):
        super().__init__()
        self.cfg, self.cont = backend_cfg, cont   # the kind's options; the continuous section's budgets
        self.lm = hc.LoadedModel(backend_cfg, loaded)   # tests and benchmarks may hand in a loaded model
        self.manager = None
        self.num_blocks: int | None = None

    @property
    def loaded(self) -> hc.Loaded | None:
        return self.lm.loaded

    def _ensure_loaded(self) -> hc.Loaded:
        return self.lm.get()

    def prepare(self, request: Request) -> None:
        self.lm.prepare(request)

    def vocab_size(self) -> int:
        return len(self._ensure_loaded().tokenizer)

    def reset_peak_memory(self) -> None:
        self.lm.reset_peak_memory()

    def peak_memory(self) -> dict:
        return self.lm.peak_memory()

    # -- setup ---------------------------------------------------------------------------
    async def start(self, clock: Clock) -> None:
        """Load, start the manager's generation thread once, then run the warm-up rounds."""
        if not isinstance(clock, RealClock):
            raise ValueError("hf-cb stamps tokens with the manager's perf_counter: it needs the RealClock")
        if self.manager is None:
            # NOTE: loading and the manager's cache on our torch thread, then that thread ended: its
            # OpenMP team alive beside the manager's thread would throttle both (torch_thread.py)
            await torch_thread.run(self._start_manager)
            torch_thread.release()
        for i in range(self.cfg.warmup_batches):
            n, p, o = WARMUP
            reqs = [Request(f"warmup{i}-{j}", p, o, clock.now(), index=-1 - j) for j in range(n)]
            async with self.session(n) as tracker:
                for r in reqs:
                    self.prepare(r)
                    await self.send(r, tracker, clock)
                await self.settle(tracker, clock)

    def _start_manager(self) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        lm = self._ensure_loaded()
        page = self.cont.block_size
        self.num_blocks = -(-self._kv_tokens() // page)
        cb = ContinuousBatchingConfig(
            num_blocks=self.num_blocks, page_size=page,
            max_batch_tokens=self.cont.max_num_batched_tokens,
            max_requests_per_batch=self.cont.max_num_seqs,
            allow_block_sharing=False)     # NOTE: no prefix caching, like our engine: same work
        gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=lm.tokenizer.pad_token_id)
        with torch.inference_mode():
            self.manager = lm.model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
            self.manager.start()

    def _kv_tokens(self) -> int:
        """KV capacity in tokens: continuous.num_kv_blocks if set, else the memory budget."""
        if self.cont.num_kv_blocks is not None:
            return self.cont.num_kv_blocks * self.cont.block_size
        lm = self.loaded
        budget = hc.device_memory_budget(lm.device, self.cfg.memory_budget_bytes)
        return max(self.cont.block_size, budget // hc.kv_bytes_per_token(lm.model.config, lm.dtype))

    async def close(self) -> None:
        if self.manager is not None:
            manager, self.manager = self.manager, None
            await asyncio.to_thread(manager.stop, True, 30.0)
            manager.destroy()

    # -- facts ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        import transformers
        lm = self._ensure_loaded()
        return {"backend": "hf-cb", "model": lm.name, "device": str(lm.device),
                "dtype": str(lm.dtype).removeprefix("torch."),
                "attn_implementation": lm.model.config._attn_implementation,
                "num_blocks": self.num_blocks, "page_size": self.cont.block_size,
                "max_requests_per_batch": self.cont.max_num_seqs,
                "max_batch_tokens": self.cont.max_num_batched_tokens,
                "torch": torch.__version__, "transformers": transformers.__version__,
                "torch_threads": torch.get_num_threads()}

    # -- the trace (LoadTarget.run_trace sends each request at its planned time) -------------
    @contextlib.asynccontextmanager
    async def session(self, concurrency: int):
        yield _Tracker(self.loaded.tokenizer)

    async def send(self, r: Request, tracker: "_Tracker", clock: Clock) -> None:
        tracker.add(r)
        # NOTE: the handler is registered before the request exists, so no output can slip past it.
        self.manager.register_result_handler(r.request_id, tracker.on_output)
        rid = self.manager.add_request(r.prompt_token_ids, request_id=r.request_id,
                                       max_new_tokens=r.max_new_tokens, streaming=True,
                                       record_timestamps=True, eos_token_id=-1)
        if rid is None:
            tracker.finish(r, "transformers' continuous batching manager refused the request (stopping?)")

    async def settle(self, tracker: "_Tracker", clock: Clock) -> None:
        await tracker.wait_all(self.manager, clock)


class _Tracker:
    """Turns the manager's streamed outputs (cumulative tokens and stamps) into request stamps."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pending: dict[str, Request] = {}
        self.event = asyncio.Event()

    def add(self, r: Request) -> None:
        self.pending[r.request_id] = r

    def on_output(self, out) -> None:
        r = self.pending.get(out.request_id)
        if r is None:
            return
        if r.scheduled_time is None and out.lifespan[0] > 0:
            r.scheduled_time = out.lifespan[0]       # when the manager took it out of its queue
        stamps = out.timestamps or []
        for i in range(r.output_len, min(len(out.generated_tokens), len(stamps))):
            r.stamp_token(stamps[i], out.generated_tokens[i])
        if out.error is not None:
            self.finish(r, f"transformers continuous batching: {out.error}")
        elif out.is_finished():
            self.finish(r, None)

    def finish(self, r: Request, error: str | None) -> None:
        self.pending.pop(r.request_id, None)
        if error is not None:
            r.fail(error)
        elif r.token_times:
            first = r.token_times[0]
            r.scheduled_time = min(r.scheduled_time or first, first)   # the manager's dequeue stamp
            finish(r, queued_as="wait_capacity")
            r.output_text = self.tokenizer.decode(r.output_token_ids, skip_special_tokens=True)
        else:
            finish(r)                          # no tokens at all: fails with the counts
        if not self.pending:
            self.event.set()

    async def wait_all(self, manager, clock: Clock) -> None:
        """Until every request has its final output; fail the rest if the manager's thread dies."""
        while self.pending:
            self.event.clear()
            if await clock.wait(self.event, 1.0):
                continue
            if not manager.is_running():
                err = manager.background_thread_status.fatal_error
                for r in list(self.pending.values()):
                    self.finish(r, f"transformers continuous batching stopped: {err or 'thread exited'}")
