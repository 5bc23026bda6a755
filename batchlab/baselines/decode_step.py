"""The step engine's decode step against generate()'s, at one batch size, on the same loaded model.

C requests with equal prompts run through continuous batching on the step engine (HFBackend.step)
with enough KV blocks that none is preempted; the median of its decode-only steps at full
occupancy is set against the median gap between generate()'s per-token stamps for the same C
requests in one batch. A ratio near 1 says the engine's bookkeeping around each forward pass is
small. Used by the CPU engine comparison and the GPU check alike.
"""
from __future__ import annotations

import statistics

import numpy as np

from batchlab.core.clock import RealClock
from batchlab.core.traffic import TraceItem, make_requests
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import ContinuousConfig
from batchlab.schedulers.continuous import ContinuousScheduler

BLOCK = 16


def kv_blocks(trace: list[TraceItem], c: int) -> int:
    """Enough KV for C of the longest sequences: nobody is preempted, and every engine compared
    gets the same."""
    longest = max(t.prompt_len + t.output_len for t in trace)
    return c * -(-longest // BLOCK) + c


async def engine_burst(hf, c: int, clock, p: int = 64, o: int = 64) -> list:
    """C requests of p prompt and o new tokens at once through continuous batching on the step
    engine: the step records of its decode-only steps at full occupancy."""
    trace = [TraceItem(0.0, p, o)] * c
    engine = hf._engine()
    mark = len(engine.step_log)
    await drive(ContinuousScheduler(ContinuousConfig(max_num_seqs=c, block_size=BLOCK), kv_blocks(trace, c)),
                hf, clock, Inbox(make_requests(trace, clock.now(), hf.prepare)))
    return [s for s in engine.step_log[mark:] if s.prefill_tokens == 0 and s.rows == c]


def tiny_engine_levels(concurrency: list[int], measure, fused: bool | None = None) -> list:
    """The tiny model on the step engine (CPU, fp32, decode passes warmed up to the largest C;
    `fused`: backend.fused), started and warmed by a small burst, then `await measure(hf, c, clock)`
    at each concurrency in turn, on one clock: the set-up the decode-step benchmarks share."""
    from batchlab.backends.hf import HFOptions  # NOTE: here, so importing this module loads no model stack
    from batchlab.backends.hf_backend import HFBackend
    hf = HFBackend(HFOptions(model="tiny", device="cpu", dtype="float32", warmup_batches=1, fused=fused),
                   warmup_shape=(8, 64, 8), decode_rows=max(concurrency))
    clock = RealClock()

    async def run_all():
        await hf.start(clock)
        await engine_burst(hf, 8, clock, 16, 8)                 # warm the engine
        return [await measure(hf, c, clock) for c in concurrency]
    return clock.run(run_all())


async def step_times(hf, c: int, clock, p: int = 64, o: int = 64) -> tuple[float, float]:
    """Median decode step (seconds) at batch C with p-token prompts and o new tokens: the engine's,
    then generate()'s. `hf` is an HFBackend."""
    ours = [s.duration for s in await engine_burst(hf, c, clock, p, o)]
    reqs = make_requests([TraceItem(0.0, p, o)] * c, clock.now(), hf.prepare)
    await hf.run_batch(reqs, clock)
    return statistics.median(ours), float(np.median(np.diff(reqs[0].token_times)))
