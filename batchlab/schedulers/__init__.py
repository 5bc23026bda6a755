"""Scheduler registry: one name per batching policy, and how to build each from a RunConfig."""
from __future__ import annotations

from batchlab.core.config import RunConfig
from batchlab.core.work import MemoryBudget
from batchlab.errors import ConfigError
from batchlab.schedulers.base import Scheduler
from batchlab.schedulers.continuous import ContinuousScheduler
from batchlab.schedulers.dynamic import DynamicScheduler
from batchlab.schedulers.naive import NaiveScheduler

__all__ = ["SCHEDULERS", "ContinuousScheduler", "DynamicScheduler", "NaiveScheduler", "Scheduler",
           "level_of", "make_scheduler"]

SCHEDULERS: dict[str, type[Scheduler]] = {
    "naive": NaiveScheduler, "dynamic": DynamicScheduler, "continuous": ContinuousScheduler}


def level_of(strategy: str) -> str | None:
    """"request" or "iteration" for our own policies; None for "server" (the backend batches)."""
    cls = SCHEDULERS.get(strategy)
    return cls.level if cls is not None else None


def make_scheduler(strategy: str, cfg: RunConfig, memory: MemoryBudget | None,
                   num_kv_blocks: int | None) -> Scheduler:
    """Build a strategy's scheduler. `memory` feeds dynamic batching's memory trigger;
    `num_kv_blocks` is the backend's KV capacity when the config leaves it unset."""
    if strategy == "naive":
        return NaiveScheduler(cfg.naive)
    if strategy == "dynamic":
        return DynamicScheduler(cfg.dynamic, memory)
    if strategy == "continuous":
        blocks = cfg.continuous.num_kv_blocks or num_kv_blocks
        if blocks is None:
            raise ConfigError("continuous.num_kv_blocks must be set for this backend")
        return ContinuousScheduler(cfg.continuous, blocks, cfg.continuous.preemption)
    raise ConfigError(f"strategies: {strategy!r} needs a backend that batches for itself")
