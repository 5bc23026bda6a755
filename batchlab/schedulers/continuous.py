"""Continuous (iteration-level) batching: the batch is re-formed at every step, FCFS.

Each step first advances every running request (one decode token, or its next prefill chunk),
then admits waiting requests while `max_num_seqs`, the token budget `max_num_batched_tokens`
and the free KV blocks allow (schedulers/kv_blocks.py); finished requests leave at once and
free their blocks. Out of blocks mid-decode (policy `recompute`, vLLM's default): the newest
running request is preempted, its blocks freed, and it goes back to the front of the queue to
recompute its prompt plus what it has generated so far; no admission happens in a step that
preempted. Policy `reserve` books prompt + max_new_tokens at admission, so it never preempts.
With `prefix_caching`, an admission reuses the cached blocks of its prompt's prefix and starts
with them computed (schedulers/prefix_cache.py); each Step then carries the cache's work.
"""
from __future__ import annotations

import sys
from typing import Annotated, Literal

from pydantic import Field

from batchlab.core.config import Model, RunConfig
from batchlab.core.limits import BatchSize, Tokens
from batchlab.core.request import Request, Status
from batchlab.core.work import Idle, Step
from batchlab.errors import ConfigError
from batchlab.schedulers.base import Given, Scheduler
from batchlab.schedulers.decode_window import return_unused, window_length
from batchlab.schedulers.kv_blocks import BlockPool
from batchlab.schedulers.prefix_cache import PrefixBlockPool

UNCHUNKED = sys.maxsize     # no chunked prefill: a prompt is computed in one step


class ContinuousConfig(Model):
    """Continuous batching's budgets (every policy on its machinery runs under them too)."""
    max_num_seqs: BatchSize = 256
    """Sequences in one step."""
    max_num_batched_tokens: Annotated[int, Field(gt=0, le=1 << 24)] = 8192
    """Tokens (prompt and decode) computed in one step."""
    num_kv_blocks: Annotated[int, Field(gt=0, le=1 << 24)] | None = None
    """KV cache size in blocks (unset: from the backend's memory)."""
    block_size: Tokens = 16
    """Tokens per KV block."""
    chunk_size: Tokens | None = None
    """Chunked prefill: prompt tokens per request per step (unset: a whole prompt in one step)."""
    preemption: Literal["recompute", "reserve"] = "recompute"
    """Out of blocks: preempt the newest and recompute it later (vLLM's way), or book prompt + output at admission."""
    prefix_caching: bool = False
    """Reuse the KV blocks of equal prompt prefixes (vLLM's automatic prefix caching)."""


class ContinuousScheduler(Scheduler):
    name, level, options_model, cap = "continuous", "iteration", ContinuousConfig, "continuous.max_num_seqs"
    title, color = "Continuous", "#0072B2"

    def __init__(self, cfg: ContinuousConfig, num_kv_blocks: int, policy: str = "recompute",
                 windows: bool = False, finish_in_window: bool = False, options: Model | None = None):
        super().__init__()
        self.cfg = cfg
        # a policy's own section (priority, sjf, vtc), its defaults when not given
        self.options = options if options is not None or not self.runs_under else self.options_model()
        self.windows = windows                     # may offer decode windows (Given.windows)
        self.finish_in_window = windows and finish_in_window
        pool = PrefixBlockPool if cfg.prefix_caching else BlockPool
        self.pool = pool(num_kv_blocks, cfg.block_size, reserve=policy == "reserve")
        self.chunk = cfg.chunk_size or UNCHUNKED
        # NOTE: a decode window assumes no arrival can be admitted ahead of the queue (driver's
        # _bound_window); a policy that reorders the queue (next_waiting) steps one at a time.
        self.fcfs = type(self).next_waiting is ContinuousScheduler.next_waiting

    @classmethod
    def from_config(cls, cfg: RunConfig, given: Given) -> ContinuousScheduler:
        """Every policy on this machinery runs under the continuous section's budgets; one with a
        section of its own (priority, sjf, vtc) also gets that section as `options`."""
        budgets = cfg.continuous
        blocks = budgets.num_kv_blocks or given.num_kv_blocks
        if blocks is None:
            raise ConfigError("continuous.num_kv_blocks must be set for this backend")
        return cls(budgets, blocks, budgets.preemption, windows=given.windows, finish_in_window=given.finish_in_window,
                   options=getattr(cfg, cls.name) if cls.runs_under else None)

    @property
    def free_blocks(self) -> int:
        return self.pool.free

    @property
    def num_kv_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def blocks(self) -> dict[Request, int]:
        return self.pool.held

    def schedule(self, now: float, draining: bool = False) -> Step | Idle:
        budget = self.cfg.max_num_batched_tokens
        chunks: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        held, bs, chunk = self.pool.held, self.pool.block_size, self.chunk
        for r in list(self.running):
            blocks = held.get(r)
            if blocks is None:                 # preempted earlier in this loop
                continue
            c = r.num_computed_tokens
            n = r.prompt_len + len(r.token_times) - c
            n = min(n, budget, chunk) if n > 1 else (n if budget >= 1 else 0)   # decodes skip the clamps
            if n <= 0:
                continue
            # NOTE: hot path (every running request, every step): touch the pool only when this
            # step's tokens spill past the blocks r holds.
            if c + n > blocks * bs and not self._make_room(r, c + n, preempted):
                continue
            chunks.append((r, n))
            budget -= n
        held_back = None if preempted else self._admit(now, chunks, budget)
        if not chunks:
            return Idle()
        window = 1
        if self.windows and self.fcfs and not preempted:
            # A window may start with this step's prefills only if admission cannot change once
            # they are done: tokens free up then, and (with a prefix cache) prompts become hits.
            steady = held_back in (None, "seqs") or held_back == "blocks" and not self.cfg.prefix_caching
            window = window_length(chunks, self.pool, steady, self._room(held_back))
        cache = self.pool.cache_ops(chunks) if self.cfg.prefix_caching else None
        return Step(chunks, preempted, repeat=window, booked=window, cache=cache)

    def _room(self, held_back: str | None) -> int | None:
        """For a window that may run past finishes: the free blocks the next admission needs
        (sys.maxsize if nobody waits: no finish lets anyone in); None if any finish might.
        NOTE: only under `reserve`, where a window books nothing: under `recompute` it would book
        every row's blocks to its last token, wasted when the next arrival cuts it short (that
        made the default sweep slower, not faster). Only the default FCFS order is predicted; a
        policy choosing otherwise, or a prefix cache, stops windows at a finish."""
        if not self.finish_in_window or self.cfg.prefix_caching or not self.pool.reserve:
            return None
        if held_back is None:
            return sys.maxsize
        if held_back == "blocks" and type(self).next_waiting is ContinuousScheduler.next_waiting:
            return self.pool.blocks_for(self.waiting[0], 0)
        return None

    def cached_tokens(self, request: Request) -> int:
        return self.pool.cached_tokens(request, remember=False)

    def _make_room(self, r: Request, tokens: int, preempted: list[Request]) -> bool:
        """Grow r's blocks, preempting the newest running requests until they fit; False if r
        itself had to go."""
        while not self.pool.grow(r, tokens):
            victim = self.victim()
            self._preempt(victim)
            preempted.append(victim)
            if victim is r:
                return False
        return True

    # Policy hooks (priority.py, sjf.py, vtc.py override them): which waiting request is admitted
    # next, and which running request gives up its blocks. FCFS: the queue's head; the newest.
    def next_waiting(self, now: float) -> Request:
        return self.waiting[0]

    def victim(self) -> Request:
        return self.running[-1]

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self.pool.release(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.status = Status.QUEUED
        self.waiting.appendleft(victim)

    def _admit(self, now: float, chunks: list, budget: int) -> str | None:
        """Admit waiting requests into this step; returns what held the rest back ("seqs",
        "tokens" or "blocks"), None if nobody is left waiting."""
        waiting, running, pool, max_seqs = self.waiting, self.running, self.pool, self.cfg.max_num_seqs
        unchunked, prefix = self.cfg.chunk_size is None, self.cfg.prefix_caching
        while waiting and len(running) < max_seqs and budget > 0:
            r = self.next_waiting(now)
            cached = pool.cached_tokens(r) if prefix else 0
            need = r.prompt_len + len(r.token_times) - cached
            n = min(need, budget, self.chunk)
            if n < need and unchunked:
                if chunks:
                    return "tokens"            # whole prompt does not fit this step's budget
                n = need                       # alone in the step: let an over-long prompt run
            if not pool.can_ever_fit(r):
                self._take(r)                  # could never finish, even alone: fail it now
                pool.release(r)
                r.fail(f"needs more than {pool.num_blocks} KV blocks of {pool.block_size} tokens")
                self.rejected.append(r)
                continue
            if not pool.grow(r, cached + n):
                return "blocks"                # hold admission until blocks free up
            r.num_computed_tokens = r.num_cached_tokens = cached
            self._take(r)
            running.append(r)
            if r.scheduled_time is None:
                r.scheduled_time = now
            r.status = Status.RUNNING
            chunks.append((r, n))
            budget -= n
        if not waiting:
            return None
        return "seqs" if len(running) >= max_seqs else "tokens"

    def _take(self, r: Request) -> None:
        if self.waiting[0] is r:
            self.waiting.popleft()
        else:
            self.waiting.remove(r)

    def finish_step(self, step: Step, now: float) -> list[Request]:
        """Advance the step's requests; those with all their tokens leave and free their blocks
        (the driver finishes them)."""
        done = []
        window = step.booked > 1               # every row got a token from each step it ran (step.ran of them)
        for r, n in step.chunks:
            had = len(r.token_times)
            if window:                         # all its KV but the newest token's (rows may leave early)
                r.num_computed_tokens = r.prompt_len + had - 1
            else:
                r.num_computed_tokens += n
            if had >= r.max_new_tokens:
                done.append(r)
        if step.cache is not None:
            self.pool.commit(step)             # blocks this step completed become cache entries
        if step.booked > step.ran:
            return_unused(step, self.pool)
        for r in done:
            self.running.remove(r)
            self.pool.release(r)
        return done

    def abort(self, request: Request) -> bool:
        if request in self.pool.held:
            self.running.remove(request)
            self.pool.release(request)
            return True
        self.pool.release(request)             # forgets a waiting request's memoized block keys
        return super().abort(request)
