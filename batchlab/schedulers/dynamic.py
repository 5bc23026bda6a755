"""Dynamic batching: launch on size, age or memory, whichever comes first.

- size: `cap` requests are waiting (cap starts at max_batch_size, adapts on out-of-memory);
- age: the oldest waiting request has waited `max_wait_ms`;
- memory: one more request would break the KV budget once every row is padded to the longest
  prompt plus the longest output (a lone oversized request still runs: progress first).
At light load the timer fires first, so E[batch] ~ min(1 + lambda * max_wait, cap).
Out-of-memory puts the batch back at the front and halves the cap; `oom_probe_after` clean
batches later the cap grows by one again (back off fast, probe slowly).
With `group_by_length`, a batch is the oldest request and the waiting ones closest to it in prompt
and output length (generate() pads every row to the longest prompt and decodes to the longest
output, so like lengths waste less); a request passed over `max_skips` times goes in the next
batch whatever its length, so none waits for ever.
"""
from __future__ import annotations

from itertools import islice
from typing import Annotated

from pydantic import Field

from batchlab.core.config import Model
from batchlab.core.limits import MAX_SECONDS, BatchSize
from batchlab.core.work import Batch, Idle, MemoryBudget
from batchlab.schedulers.base import Given, RequestLevelScheduler


class DynamicConfig(Model):
    """Dynamic batching: launch on size, age or memory, whichever comes first."""
    max_batch_size: BatchSize = 16
    """Size trigger and hard cap, requests."""
    max_wait_ms: Annotated[float, Field(ge=0, le=MAX_SECONDS * 1000)] = 50.0
    """Age trigger: the oldest waiting request's wait, milliseconds."""
    oom_probe_after: Annotated[int, Field(gt=0, le=1_000_000)] = 20
    """Clean batches before the cap, halved on out-of-memory, grows by one."""
    group_by_length: bool = False
    """Fill a batch with the waiting requests closest in prompt and output length to the oldest, not the next in line."""
    max_skips: Annotated[int, Field(ge=0, le=1_000_000)] = 32
    """group_by_length: batches a request may be passed over before it goes in the next whatever its length."""


class DynamicScheduler(RequestLevelScheduler):
    name, options_model, cap = "dynamic", DynamicConfig, "dynamic.max_batch_size"
    title, color = "Dynamic", "#009E73"

    @classmethod
    def from_config(cls, cfg, given: Given) -> DynamicScheduler:
        return cls(cfg.dynamic, given.memory)

    def __init__(self, cfg: DynamicConfig, memory: MemoryBudget | None = None):
        super().__init__()
        self.max_batch_size = cfg.max_batch_size
        self.max_wait = cfg.max_wait_ms / 1000.0
        self.probe_after = cfg.oom_probe_after
        self.memory = memory
        self.cap = cfg.max_batch_size         # adaptive: halves on OOM, +1 after clean batches
        self.clean_batches = 0
        self.grouped, self.max_skips = cfg.group_by_length, cfg.max_skips
        self.skips: dict[str, int] = {}       # group_by_length: request id -> batches it was passed over

    def schedule(self, now: float, draining: bool = False) -> Batch | Idle:
        if self.running or not self.waiting:
            return Idle()
        n = min(len(self.waiting), self.cap)
        if self.grouped and n < len(self.waiting):
            self.bring_forward(n)
        if self.memory is not None:
            fit = self.memory.rows_that_fit(list(islice(self.waiting, n)))
            if fit < n:  # the next waiting request would break the budget: go now
                return self.launch(fit, now, "memory")
        if n >= self.cap:
            return self.launch(n, now, "size")
        deadline = self.waiting[0].arrival_time + self.max_wait
        if now >= deadline:
            return self.launch(n, now, "age")
        return Idle(wake_at=deadline)

    def bring_forward(self, n: int) -> None:
        """Move the n requests the next batch takes to the front of the queue, in arrival order:
        the oldest, those passed over max_skips times, then the closest in length to the oldest.
        Every request left behind that was ahead in line of one taken counts a skip."""
        queue = list(self.waiting)
        head, rest = queue[0], queue[1:]
        due = [r for r in rest if self.skips.get(r.request_id, 0) >= self.max_skips][:n - 1]
        near = sorted((r for r in rest if r not in due), key=lambda r: _distance(head, r))
        taken = {id(r) for r in [head, *due, *near[:n - 1 - len(due)]]}
        batch = [r for r in queue if id(r) in taken]
        last = max(i for i, r in enumerate(queue) if id(r) in taken)
        for r in queue[:last]:
            if id(r) not in taken:
                self.skips[r.request_id] = self.skips.get(r.request_id, 0) + 1
        for r in batch:
            self.skips.pop(r.request_id, None)
        self.waiting.clear()
        self.waiting.extend(batch + [r for r in queue if id(r) not in taken])

    def finish_batch(self, batch: Batch, now: float, oom: bool | str = False) -> None:
        self.running = []
        if oom and len(batch.requests) == 1:
            super().finish_batch(batch, now, oom=oom)    # does not fit even alone: fail (with why), don't loop
            return
        if oom:
            self.requeue(batch)
            self.cap = max(1, min(self.cap, len(batch.requests)) // 2)
            self.clean_batches = 0
            return
        self.clean_batches += 1
        if self.clean_batches >= self.probe_after:
            self.cap = min(self.max_batch_size, self.cap + 1)
            self.clean_batches = 0


def _distance(a, b) -> float:
    """How unlike two requests' lengths are: relative differences of prompt and output."""
    return abs(a.prompt_len - b.prompt_len) / max(a.prompt_len, 1) + \
        abs(a.max_new_tokens - b.max_new_tokens) / max(a.max_new_tokens, 1)
