"""Naive batching: wait for exactly `batch_size` requests, run them to the end, repeat.

Its only launch condition is the queue length, so at light load the first request of a batch
waits for N - 1 more arrivals: on average (N - 1) / (2 lambda) seconds before anything runs.
At shutdown (`draining`) the remainder is flushed as a smaller batch, or it would wait forever.
"""
from __future__ import annotations

from batchlab.core.config import Model
from batchlab.core.limits import BatchSize
from batchlab.core.work import Batch, Idle
from batchlab.schedulers.base import Given, RequestLevelScheduler


class NaiveConfig(Model):
    """Naive batching: wait for exactly `batch_size` requests, run them to the end."""
    batch_size: BatchSize = 16
    """Requests per batch; a batch waits for exactly this many."""


class NaiveScheduler(RequestLevelScheduler):
    name, options_model, cap = "naive", NaiveConfig, "naive.batch_size"
    title, color = "Naive", "#D55E00"

    @classmethod
    def from_config(cls, cfg, given: Given) -> NaiveScheduler:
        return cls(cfg.naive)

    def __init__(self, cfg: NaiveConfig):
        super().__init__()
        self.batch_size = cfg.batch_size

    def schedule(self, now: float, draining: bool = False) -> Batch | Idle:
        if self.running:
            return Idle()
        if len(self.waiting) >= self.batch_size:
            return self.launch(self.batch_size, now, "size")
        if draining and self.waiting:
            return self.launch(len(self.waiting), now, "drain")
        return Idle()
