"""Scheduler registry: one name per batching policy, and how to build each from a RunConfig.

Built in: naive and dynamic (request level), continuous and the policies on its machinery
(priority, sjf, vtc). Any other name is a policy of your own (schedulers/plugins.py), built
with its `from_config` and run behind the contract check (schedulers/guard.py).
"""
from __future__ import annotations

from batchlab.core.config import RunConfig
from batchlab.core.work import MemoryBudget
from batchlab.errors import ConfigError
from batchlab.schedulers.base import Scheduler
from batchlab.schedulers.continuous import ContinuousScheduler
from batchlab.schedulers.dynamic import DynamicScheduler
from batchlab.schedulers.guard import Guarded
from batchlab.schedulers.naive import NaiveScheduler
from batchlab.schedulers.plugins import load_policy
from batchlab.schedulers.priority import PriorityScheduler
from batchlab.schedulers.sjf import SJFScheduler
from batchlab.schedulers.vtc import VTCScheduler

__all__ = ["SCHEDULERS", "ContinuousScheduler", "DynamicScheduler", "NaiveScheduler", "PriorityScheduler",
           "SJFScheduler", "Scheduler", "VTCScheduler", "level_of", "make_scheduler", "scheduler_class"]

SCHEDULERS: dict[str, type[Scheduler]] = {
    "naive": NaiveScheduler, "dynamic": DynamicScheduler, "continuous": ContinuousScheduler,
    "priority": PriorityScheduler, "sjf": SJFScheduler, "vtc": VTCScheduler}


def scheduler_class(strategy: str) -> type[Scheduler] | None:
    """The class a strategy names (None for "server": the backend batches); ConfigError if a
    policy of your own cannot be loaded."""
    if strategy == "server":
        return None
    return SCHEDULERS.get(strategy) or load_policy(strategy)


def level_of(strategy: str) -> str | None:
    """"request" or "iteration" for a policy; None for "server" (the backend batches)."""
    cls = scheduler_class(strategy)
    return cls.level if cls is not None else None


def make_scheduler(strategy: str, cfg: RunConfig, memory: MemoryBudget | None,
                   num_kv_blocks: int | None) -> Scheduler:
    """Build a strategy's scheduler. `memory` feeds dynamic batching's memory trigger;
    `num_kv_blocks` is the backend's KV capacity when the config leaves it unset."""
    cls = scheduler_class(strategy)
    if cls is None:
        raise ConfigError(f"strategies: {strategy!r} needs a backend that batches for itself")
    if strategy in SCHEDULERS:
        return cls.from_config(cfg, memory, num_kv_blocks)
    try:
        inner = cls.from_config(cfg, memory, num_kv_blocks)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"strategies: policy '{strategy}': from_config() raised {type(e).__name__}: {e}") from None
    return Guarded(inner, strategy, cfg.continuous)
