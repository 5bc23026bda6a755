"""Continuous (iteration-level) batching: the batch is re-formed at every step, FCFS.

Each step first advances every running request (one decode token, or its next prefill chunk),
then admits waiting requests while `max_num_seqs`, the token budget `max_num_batched_tokens`
and the free KV blocks allow. A request needs ceil(tokens / block_size) blocks for the tokens
it has computed; finished requests leave at once and free their blocks.
Out of blocks mid-decode (policy `recompute`, vLLM's default): the newest running request is
preempted, its blocks freed, and it goes back to the front of the queue to recompute its
prompt plus what it has generated so far; no admission happens in a step that preempted.
Policy `reserve` instead books prompt + max_new_tokens at admission, so it never preempts.
"""
from __future__ import annotations

from batchlab.core.config import ContinuousConfig
from batchlab.core.request import Request, Status
from batchlab.schedulers.base import Idle, Scheduler, Step


class ContinuousScheduler(Scheduler):
    level = "iteration"

    def __init__(self, cfg: ContinuousConfig, num_kv_blocks: int, policy: str = "recompute"):
        super().__init__()
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.num_kv_blocks = num_kv_blocks
        self.free_blocks = num_kv_blocks
        self.blocks: dict[Request, int] = {}       # blocks held by each running request
        self.reserve = policy == "reserve"
        self.chunk = cfg.chunk_size or 1 << 62

    def _blocks_for(self, r: Request, tokens: int) -> int:
        if self.reserve:
            tokens = r.prompt_len + r.max_new_tokens
        return -(-tokens // self.block_size)

    def _grow(self, r: Request, tokens: int) -> bool:
        extra = self._blocks_for(r, tokens) - self.blocks.get(r, 0)
        if extra > self.free_blocks:
            return False
        if extra > 0:
            self.free_blocks -= extra
            self.blocks[r] = self.blocks.get(r, 0) + extra
        return True

    def _release(self, r: Request) -> None:
        self.free_blocks += self.blocks.pop(r, 0)

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self._release(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.status = Status.QUEUED
        self.waiting.appendleft(victim)

    def schedule(self, now: float, draining: bool = False) -> Step | Idle:
        budget = self.cfg.max_num_batched_tokens
        chunks: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        blocks, bs, chunk = self.blocks, self.block_size, self.chunk
        for r in list(self.running):
            held = blocks.get(r)
            if held is None:                   # preempted earlier in this loop
                continue
            c = r.num_computed_tokens
            n = r.prompt_len + len(r.token_times) - c
            if n > 1:                          # decodes (n == 1) skip the clamping
                n = min(n, budget, chunk)
            elif budget < 1:
                n = 0
            if n <= 0:
                continue
            # NOTE: hot path (every running request, every step): only touch the block
            # bookkeeping when this step crosses into a block the request does not hold.
            if -(-(c + n) // bs) > held:
                while not self._grow(r, c + n):
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is r:
                        break
                else:
                    chunks.append((r, n))
                    budget -= n
                continue
            chunks.append((r, n))
            budget -= n
        if not preempted:
            self._admit(now, chunks, budget)
        if not chunks:
            return Idle()
        window = 1 if preempted else self._decode_window(chunks)
        return Step(chunks, preempted, repeat=window, booked=window)

    def _decode_window(self, chunks: list[tuple[Request, int]]) -> int:
        """How many identical decode-only steps are safe: until the first request finishes,
        within the free blocks; 1 if anything is prefilling. Admission cannot change inside
        the window: whoever waits now is blocked by seqs, tokens or blocks, none of which free
        up before a request finishes. Blocks for the whole window are booked now."""
        last, n_last = chunks[-1]              # admissions come last: the usual reason to stop
        if not self.multi_step or n_last != 1 or not last.token_times:
            return 1
        k = 1 << 62
        for r, n in chunks:
            left = r.max_new_tokens - len(r.token_times)
            if n != 1 or left == r.max_new_tokens or r.num_computed_tokens + 1 != r.prompt_len + len(r.token_times):
                return 1                       # someone is prefilling
            if left < k:
                k = left
        if self.reserve or self.free_blocks >= len(chunks) * -(-k // self.block_size):
            lo = k                             # blocks cannot run out within k steps
        else:
            lo = 1
            while lo < k:                      # largest window whose extra blocks fit
                mid = (lo + k + 1) // 2
                if self._extra_blocks(chunks, mid) <= self.free_blocks:
                    lo = mid
                else:
                    k = mid - 1
        if not self.reserve:
            for r, _ in chunks:
                self._grow(r, r.num_computed_tokens + lo)
        return lo

    def _extra_blocks(self, chunks, steps: int) -> int:
        return sum(max(0, self._blocks_for(r, r.num_computed_tokens + steps) - self.blocks[r]) for r, _ in chunks)

    def _admit(self, now: float, chunks: list, budget: int) -> None:
        while self.waiting and len(self.running) < self.cfg.max_num_seqs and budget > 0:
            r = self.waiting[0]
            need = r.num_tokens - r.num_computed_tokens
            n = min(need, budget, self.chunk)
            if n < need and self.cfg.chunk_size is None:
                if chunks:
                    return                     # whole prompt does not fit this step's budget
                n = need                       # alone in the step: let an over-long prompt run
            if -(-(r.prompt_len + r.max_new_tokens) // self.block_size) > self.num_kv_blocks:
                self.waiting.popleft()         # could never finish, even alone: fail it now
                r.fail(f"needs more than {self.num_kv_blocks} KV blocks of {self.block_size} tokens")
                self.rejected.append(r)
                continue
            if not self._grow(r, r.num_computed_tokens + n):
                return                         # hold admission until blocks free up
            self.waiting.popleft()
            self.running.append(r)
            if r.scheduled_time is None:
                r.scheduled_time = now
            r.status = Status.RUNNING
            chunks.append((r, n))
            budget -= n

    def finish_step(self, step: Step, now: float) -> list[Request]:
        done = []
        repeat = step.repeat
        for r, n in step.chunks:
            r.num_computed_tokens += n * repeat
            if len(r.token_times) >= r.max_new_tokens:
                done.append(r)
        if step.booked > step.repeat:          # the window was cut short: return the
            for r, _ in step.chunks:           # blocks booked for steps that did not run
                if r not in self.blocks:
                    continue
                surplus = self.blocks[r] - self._blocks_for(r, r.num_computed_tokens)
                if surplus > 0:
                    self.blocks[r] -= surplus
                    self.free_blocks += surplus
        for r in done:
            self.running.remove(r)
            self._release(r)
            r.status = Status.FINISHED
        return done

    def abort(self, request: Request) -> bool:
        if request in self.blocks:
            self.running.remove(request)
            self._release(request)
            return True
        return super().abort(request)
