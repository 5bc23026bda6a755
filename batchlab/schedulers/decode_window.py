"""Decode windows: a simulator speed-up, kept out of the policy.

When every request in a step gets a token from it (a decode, or a prefill that completes its
prompt) and nothing can change the batch for k steps, the k - 1 steps after it are identical
decode steps but for their context length. A backend that declares `runs_decode_windows` (the
simulator, the HF step engine) then runs them in one call (`Step.repeat = k`), stopping early at
the next arrival (`Step.until`, set by the driver); it may also run fewer (the HF engine runs a
window that starts with prefills as one step), and returns how many it ran (`Step.ran`). Results are bit-identical to stepping one at a
time (tests/backends/test_simulated.py).
Admission cannot change inside the window: whoever waits now is blocked by sequences, tokens
or blocks, none of which free up before a running request finishes. A window that starts with
prefills frees the token budget after its first step, so the scheduler allows one only when no
waiting request is held back by tokens (see ContinuousScheduler.schedule).
A finish frees a sequence slot and blocks, so a window normally ends at the first one. When no
one acts on a finish before the window ends (the driver says so: no session waits to send its
next turn) and the scheduler can tell that it admits nobody (under `reserve`: nobody waits, or
the head of the queue needs more blocks than the finishers free), the window runs on, and each
request leaves it with its last token.
"""
from __future__ import annotations

import sys

from batchlab.core.request import Request
from batchlab.core.work import Step
from batchlab.schedulers.kv_blocks import BlockPool, cdiv


def window_length(chunks: list[tuple[Request, int]], pool: BlockPool, prefills: bool = False,
                  room: int | None = None) -> int:
    """How many steps are safe in one window, within the free blocks that hold no cached prefix:
    until the first request finishes, or (`room` given: finishes cannot change admission until
    the free blocks reach `room`) until the finish that frees that many, or the last one. 1 if a
    row gets no token from this step (a partial prefill chunk), or if a row is prefilling and
    `prefills` is False. Blocks for the whole window are booked now."""
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
    if room == sys.maxsize:                # nobody waits: to the last finish
        k = max(r.max_new_tokens - len(r.token_times) for r, _ in chunks)
    elif room is not None:
        k = _past_finishes(chunks, pool, room)
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
            pool.grow(r, r.num_computed_tokens + n + min(lo, r.max_new_tokens - len(r.token_times)) - 1)
    return lo


def _past_finishes(chunks: list[tuple[Request, int]], pool: BlockPool, room: int) -> int:
    """Steps until the finish after which the free blocks reach `room` (each finisher frees what
    it holds), or until the last request finishes."""
    held = pool.held
    ends = sorted([(r.max_new_tokens - len(r.token_times), held[r]) for r, _ in chunks])
    free = pool.free
    for i, (left, blocks) in enumerate(ends):
        free += blocks
        if free >= room and (i + 1 == len(ends) or ends[i + 1][0] > left):
            return left                    # the step that may admit someone comes after this one
    return ends[-1][0]


def _extra_blocks(chunks: list[tuple[Request, int]], pool: BlockPool, steps: int) -> int:
    """Blocks the rows need beyond what they hold to run `steps` steps (or until they finish):
    this one (n tokens), then one token per step."""
    return sum(max(0, pool.blocks_for(r, r.num_computed_tokens + n + min(steps, r.max_new_tokens - len(r.token_times)) - 1)
                   - pool.held[r]) for r, n in chunks)


def return_unused(step: Step, pool: BlockPool) -> None:
    """The backend cut the window short (an arrival): give back blocks booked for steps that
    did not run."""
    if step.booked <= step.ran:
        return
    for r, _ in step.chunks:
        if r in pool.held:
            pool.shrink_to(r, r.num_computed_tokens)
