"""Decode windows: a simulator speed-up, kept out of the policy.

When every running request is decoding one token per step and nothing can change the batch for
k steps, those k steps are identical but for their context length. A backend that declares
`runs_decode_windows` (the simulator, the HF step engine) then runs them in one call
(`Step.repeat = k`), stopping early at the next arrival (`Step.until`, set by the driver).
Results are bit-identical to stepping one at a time (tests/backends/test_simulated.py).
Admission cannot change inside the window: whoever waits now is blocked by sequences, tokens
or blocks, none of which free up before a running request finishes.
"""
from __future__ import annotations

from batchlab.core.request import Request
from batchlab.core.work import Step
from batchlab.schedulers.kv_blocks import BlockPool, cdiv


def window_length(chunks: list[tuple[Request, int]], pool: BlockPool) -> int:
    """How many identical decode-only steps are safe: until the first request finishes, within
    the free blocks; 1 if anything is prefilling. Blocks for the whole window are booked now."""
    last, n_last = chunks[-1]              # admissions come last: the usual reason to stop
    if n_last != 1 or not last.token_times:
        return 1
    k = None
    for r, n in chunks:
        left = r.max_new_tokens - len(r.token_times)
        if n != 1 or left == r.max_new_tokens or r.num_computed_tokens + 1 != r.prompt_len + len(r.token_times):
            return 1                       # someone is prefilling
        if k is None or left < k:
            k = left
    if pool.reserve or pool.free >= len(chunks) * cdiv(k, pool.block_size):
        lo = k                             # blocks cannot run out within k steps
    else:
        lo = 1
        while lo < k:                      # largest window whose extra blocks fit
            mid = (lo + k + 1) // 2
            if _extra_blocks(chunks, pool, mid) <= pool.free:
                lo = mid
            else:
                k = mid - 1
    if not pool.reserve:
        for r, _ in chunks:
            pool.grow(r, r.num_computed_tokens + lo)
    return lo


def _extra_blocks(chunks: list[tuple[Request, int]], pool: BlockPool, steps: int) -> int:
    return sum(max(0, pool.blocks_for(r, r.num_computed_tokens + steps) - pool.held[r]) for r, _ in chunks)


def return_unused(step: Step, pool: BlockPool) -> None:
    """The backend cut the window short (an arrival): give back blocks booked for steps that
    did not run."""
    if step.booked <= step.repeat:
        return
    for r, _ in step.chunks:
        if r in pool.held:
            pool.shrink_to(r, r.num_computed_tokens)
