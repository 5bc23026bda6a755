"""Decode windows: a simulator speed-up, kept out of the policy.

When every request in a step gets a token from it (a decode, or a prefill that completes its
prompt) and nothing can change the batch for k steps, the k - 1 steps after it are identical
decode steps but for their context length. A backend that declares `runs_decode_windows` (the
simulator, the HF step engine) then runs them in one call (`Step.repeat = k`), stopping early at
the next arrival (`Step.until`, set by the driver); it may also run fewer (the HF engine runs a
window that starts with prefills as one step). Results are bit-identical to stepping one at a
time (tests/backends/test_simulated.py).
Admission cannot change inside the window: whoever waits now is blocked by sequences, tokens
or blocks, none of which free up before a running request finishes. A window that starts with
prefills frees the token budget after its first step, so the scheduler allows one only when no
waiting request is held back by tokens (see ContinuousScheduler.schedule).
"""
from __future__ import annotations

import sys

from batchlab.core.request import Request
from batchlab.core.work import Step
from batchlab.schedulers.kv_blocks import BlockPool, cdiv


def window_length(chunks: list[tuple[Request, int]], pool: BlockPool, prefills: bool = False) -> int:
    """How many steps are safe in one window: until the first request finishes, within the free
    blocks that hold no cached prefix; 1 if a row gets no token from this step (a partial prefill
    chunk), or if a row is prefilling and `prefills` is False. Blocks for the whole window are
    booked now."""
    last, n_last = chunks[-1]              # admissions come last: the usual reason to stop
    if not prefills and (n_last != 1 or not last.token_times):
        return 1
    k = sys.maxsize
    for r, n in chunks:                    # NOTE: hot path (every row of every step)
        had = len(r.token_times)
        if r.num_computed_tokens + n != r.prompt_len + had or not prefills and (n != 1 or not had):
            return 1                       # no token from this step, or a prefill we may not lead with
        if r.max_new_tokens - had < k:
            k = r.max_new_tokens - had
    if k < 2:
        return 1
    spare = pool.spare                     # free blocks it may book without evicting a cached prefix
    if pool.reserve or spare >= len(chunks) * cdiv(k, pool.block_size):
        lo = k                             # blocks cannot run out within k steps
    else:
        lo = 1
        while lo < k:                      # largest window whose extra blocks fit
            mid = (lo + k + 1) // 2
            if _extra_blocks(chunks, pool, mid) <= spare:
                lo = mid
            else:
                k = mid - 1
    if not pool.reserve:
        for r, n in chunks:
            pool.grow(r, r.num_computed_tokens + n + lo - 1)
    return lo


def _extra_blocks(chunks: list[tuple[Request, int]], pool: BlockPool, steps: int) -> int:
    """Blocks the rows need beyond what they hold to run `steps` steps: this one (n tokens), then
    one token per step."""
    return sum(max(0, pool.blocks_for(r, r.num_computed_tokens + n + steps - 1) - pool.held[r]) for r, n in chunks)


def return_unused(step: Step, pool: BlockPool) -> None:
    """The backend cut the window short (an arrival): give back blocks booked for steps that
    did not run."""
    if step.booked <= step.repeat:
        return
    for r, _ in step.chunks:
        if r in pool.held:
            pool.shrink_to(r, r.num_computed_tokens)
