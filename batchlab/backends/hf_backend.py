"""Hugging Face backend: request-level batches through `generate()`, every token stamped.

A batch is left-padded to its longest prompt and decoded greedily, in lockstep, to its longest
target; each row keeps its first `max_new_tokens` tokens, so the padding and the over-long
decode that request-level batching wastes are real and show in the timings. EOS is suppressed
(min_new_tokens = max_new_tokens), so every strategy gets answers of the same lengths.
Per-token stamps come from a stopping criterion, which `generate()` calls once per new token:
it synchronizes the device, then reads the clock. `generate()` blocks, so it runs on the
process's torch thread (backends/torch_thread.py) and the event loop stays free. Continuous batching delegates to backends/hf_engine.py.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from batchlab.backends import hf_common as hc
from batchlab.backends import torch_thread
from batchlab.backends.base import Engine, EngineFacts, OutOfMemory
from batchlab.backends.hf_engine import StepEngine, backend_efficiency
from batchlab.core.clock import Clock
from batchlab.core.request import Request
from batchlab.core.work import Step

OomHook = Callable[[list[Request]], bool]


class StampEveryToken(StoppingCriteria):
    """Never stops generation; records when each new token exists (after prefill for the first).
    With `requests`, each row's new token and stamp go onto its request as they happen, so a
    server can stream them while the batch still runs (the final record rewrites the same)."""

    def __init__(self, clock: Clock, device: torch.device, requests: list[Request] = ()):
        self.clock, self.device, self.stamps = clock, device, []
        self.requests = list(requests)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        hc.synchronize(self.device)
        now = self.clock.now()
        self.stamps.append(now)
        if self.requests:
            for r, tok in zip(self.requests, input_ids[:, -1].tolist()):
                if len(r.token_times) < r.max_new_tokens:
                    r.stamp_token(now, tok)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class HFBackend(Engine):
    def __init__(self, backend_cfg, warmup_shape: tuple[int, int, int] = (4, 16, 8),
                 oom_when: OomHook | None = None, decode_rows: int = 64, loaded: hc.Loaded | None = None):
        self.cfg = backend_cfg
        self.lm = hc.LoadedModel(backend_cfg, loaded)
        self.warmup_shape = warmup_shape     # (rows, prompt tokens, new tokens) of a warm-up batch
        self.decode_rows = decode_rows       # compile: decode buckets built at start-up, up to this many rows
        self.oom_when = oom_when             # tests: a batch for which this is True raises OOM
        self.reserve_bytes = 0               # GPU activation reserve, measured by a test batch
        self.engine = None                   # hf_engine.StepEngine, built on the first step

    @property
    def loaded(self) -> hc.Loaded | None:
        return self.lm.loaded

    def _ensure_loaded(self) -> hc.Loaded:
        return self.lm.get()

    # -- setup ---------------------------------------------------------------------------
    async def start(self, clock: Clock) -> None:
        """Load once; then run the warm-up batches (their requests belong to no trace)."""
        await torch_thread.run(self._ensure_loaded)
        for i in range(self.cfg.warmup_batches):
            await self._warmup_batch(clock, measure=(i == 0))
        if self.cfg.compile:
            await self._engine().warm(self.decode_rows, clock)

    async def _warmup_batch(self, clock: Clock, measure: bool) -> None:
        rows, p, n = self.warmup_shape
        p = max(1, min(p, hc.context_length(self.loaded.model) - n))
        reqs = [Request(f"warmup{i}", p, n, clock.now(), index=-1 - i) for i in range(rows)]
        for r in reqs:
            self.prepare(r)
        dev = self.loaded.device
        if measure and dev.type == "cuda":
            hc.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
        await self.run_batch(reqs, clock)
        if measure and dev.type == "cuda":
            # NOTE: what the test batch needed beyond its own KV is activations and workspace;
            # we keep twice that free, because bigger batches need more of it.
            kv = rows * (p + n) * self.kv_bytes_per_token
            self.reserve_bytes = 2 * max(0, torch.cuda.max_memory_allocated(dev) - before - kv)

    async def close(self) -> None:
        dev = self.lm.unload()
        self.engine = None
        if dev is not None:
            hc.free_cached(dev)

    # -- facts ---------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        lm = self._ensure_loaded()
        return hc.kv_bytes_per_token(lm.model.config, lm.dtype)

    def describe(self) -> dict[str, Any]:
        import transformers
        lm = self._ensure_loaded()
        facts = {"backend": "hf", "model": lm.name, "model_path": hc.resolve_model(self.cfg.model),
                 "device": str(lm.device), "dtype": str(lm.dtype).removeprefix("torch."),
                 "params": sum(p.numel() for p in lm.model.parameters()),
                 "kv_bytes_per_token": self.kv_bytes_per_token,
                 "memory_budget_bytes": self._kv_budget(),
                 "torch": torch.__version__, "transformers": transformers.__version__,
                 "torch_threads": torch.get_num_threads()}
        if lm.device.type == "cuda":
            facts["gpu"] = torch.cuda.get_device_name(lm.device)
        return facts

    def _kv_budget(self) -> int:
        lm = self._ensure_loaded()
        return hc.device_memory_budget(lm.device, self.cfg.memory_budget_bytes, self.reserve_bytes)

    def facts(self) -> EngineFacts:
        lm = self._ensure_loaded()
        return EngineFacts(frozenset({"request", "iteration"}), decode_windows=True,   # hf_engine.StepEngine runs windows
                           kv_bytes_per_token=self.kv_bytes_per_token, kv_budget_bytes=self._kv_budget(),
                           vocab_size=len(lm.tokenizer), max_context=hc.context_length(lm.model))

    def tokenizer(self) -> Any:
        return self._ensure_loaded().tokenizer

    def reset_peak_memory(self) -> None:
        self.lm.reset_peak_memory()

    def peak_memory(self) -> dict[str, Any]:
        return self.lm.peak_memory()

    def prepare(self, request: Request) -> None:
        self.lm.prepare(request)

    # -- requests ------------------------------------------------------------------------
    async def run_batch(self, requests: list[Request], clock: Clock) -> None:
        stamper = StampEveryToken(clock, self._ensure_loaded().device, requests)
        try:
            out, width = await torch_thread.run(self._generate, requests, stamper)
        except Exception as e:
            if not hc.is_oom(e):
                raise
            hc.free_cached(self.loaded.device)
            raise OutOfMemory(f"{len(requests)} rows: {e}") from e
        self._record(requests, out, width, stamper.stamps)

    def _generate(self, requests: list[Request], stamper: StampEveryToken) -> tuple[torch.Tensor, int]:
        """The torch thread: pad, generate to the batch's longest target, return ids and pad width."""
        lm = self.loaded
        if self.oom_when is not None and self.oom_when(requests):
            raise torch.OutOfMemoryError(f"injected out-of-memory for a batch of {len(requests)}")
        ids, mask = self._left_pad(requests)
        n = max(r.max_new_tokens for r in requests)
        gen = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                               pad_token_id=lm.tokenizer.pad_token_id,
                               eos_token_id=lm.tokenizer.eos_token_id)
        with torch.inference_mode():
            out = lm.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen,
                                    stopping_criteria=StoppingCriteriaList([stamper]))
        return out.cpu(), ids.shape[1]

    def _left_pad(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        lm = self.loaded
        width = max(len(r.prompt_token_ids) for r in requests)
        ids = torch.full((len(requests), width), lm.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            k = len(r.prompt_token_ids)
            ids[i, width - k:] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
            mask[i, width - k:] = 1
        return ids.to(lm.device), mask.to(lm.device)

    def _record(self, requests: list[Request], out: torch.Tensor, width: int, stamps: list[float]) -> None:
        """Row i keeps its first n tokens and the first n stamps (fewer only if generate stopped early)."""
        tok = self.loaded.tokenizer
        for i, r in enumerate(requests):
            n = min(r.max_new_tokens, len(stamps), out.shape[1] - width)
            r.token_times[:] = stamps[:n]
            r.output_token_ids[:] = out[i, width:width + n].tolist()
            r.output_text = tok.decode(r.output_token_ids, skip_special_tokens=True)

    # -- continuous batching (iteration level) ----------------------------------------------
    def _engine(self) -> StepEngine:
        if self.engine is None:
            lm = self._ensure_loaded()
            self.engine = torch_thread.call(StepEngine, lm.model, lm.tokenizer, lm.device, compile=self.cfg.compile,
                                            fused=self.cfg.fused)
        return self.engine

    async def step(self, step: Step, clock: Clock) -> int:
        return await self._engine().step(step, clock)

    def release(self, request: Request) -> None:
        if self.engine is not None:
            self.engine.release(request)

    def point_facts(self, measured_from: float, summary: dict[str, Any]) -> dict[str, Any]:
        """Continuous points on the step engine: achieved tok/s over what its own measured step
        time allows at the run's occupancy (backend_eff; below 1 = idle time and overhead)."""
        records = [s for s in self.engine.step_log if s.start >= measured_from] if self.engine else []
        return backend_efficiency(records, summary["throughput_tok_s"]) if records else {}


def typical_len(d, default: int) -> int:
    """A representative length of a LengthDist, for the warm-up batch's shape."""
    for v in (d.value, d.median, d.high):
        if v:
            return int(v)
    return default
