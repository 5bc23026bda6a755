"""What a scheduler hands the driver, and what a backend receives: a Batch, a Step, or Idle.

These are the vocabulary schedulers and backends share, so they live below both: a scheduler
fills them in (schedulers/), a backend executes them (backends/), the driver carries them between
(run/driver.py), and neither side imports the other. `MemoryBudget` is a backend's KV memory as
a request-level scheduler sees it; `CacheOps` is the prefix cache's work a step carries.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from batchlab.core.request import Request


@dataclass(slots=True)
class Batch:
    requests: list[Request]
    trigger: str                      # size | age | memory | drain


@dataclass(slots=True)
class Step:
    chunks: list[tuple[Request, int]]           # (request, tokens to compute this step)
    preempted: list[Request] = field(default_factory=list)
    # Decode window: when every chunk gets a token from this step (a decode, or a prefill that
    # completes its prompt) and nothing could change the batch for a while, the scheduler may
    # offer `repeat` steps in a row: this one, then decodes of every chunk until it has all its
    # tokens. A backend that runs them (the simulator) stops early after the first step ending at
    # or after `until` (the next arrival) and returns the steps it ran, which the driver records
    # in `ran` before handing the step back. Results are identical to stepping one at a time; it
    # only saves bookkeeping per step.
    repeat: int = 1
    until: float | None = None
    booked: int = 1                   # steps the scheduler booked KV blocks for (the offer)
    ran: int = 1                      # steps the backend ran (set by the driver)
    cache: CacheOps | None = None     # prefix caching on: what a KV-keeping backend must do

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


@dataclass(slots=True)
class CacheOps:
    """A step's prefix-cache work, for a backend that keeps KV itself (the HF step engine); the
    scheduler's pool decides it (schedulers/prefix_cache.py), the backend only executes it:
    drop `evict` first, copy each `load` into the request's KV before the pass, and after the
    pass keep a copy of each `store` block. Keys name a full block's content and its prefix."""
    block_size: int                                       # tokens per block
    load: list[tuple[Request, list[int]]]                 # admitted with a hit: keys of its first blocks
    store: list[tuple[Request, int, int]]                 # (request, block index, key) this step completes
    evict: list[int]                                      # keys that left the cache before this step


@dataclass(slots=True)
class Idle:
    wake_at: float | None = None      # None: nothing to do until a request arrives


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Padding-aware KV accounting for request-level batches (seed question 0.4)."""
    budget_bytes: int                 # bytes available to the KV cache
    kv_bytes_per_token: int           # 2 x layers x kv_heads x head_dim x dtype bytes

    def rows_that_fit(self, candidates: list[Request]) -> int:
        """How many candidates, oldest first, fit once padded to the longest prompt and output.
        At least 1, so one oversized request still makes progress."""
        p_max = o_max = 0
        for i, r in enumerate(candidates):
            p_max, o_max = max(p_max, r.prompt_len), max(o_max, r.max_new_tokens)
            if (i + 1) * (p_max + o_max) * self.kv_bytes_per_token > self.budget_bytes:
                return max(i, 1)
        return len(candidates)
