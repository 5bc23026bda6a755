"""Scheduler registry: one line per batching policy; each class describes itself (schedulers/base.py).

Built in: naive and dynamic (request level), continuous and the policies on its machinery
(priority, sjf, vtc). `register(cls)` adds one at run time (a plugin module, a test); its options
model then becomes a config section named after it. Any other strategy name is a policy of your
own (schedulers/plugins.py), built with its `from_config` and run behind the contract check
(schedulers/guard.py).
"""
from __future__ import annotations

from batchlab.core.config import Model, RunConfig
from batchlab.errors import ConfigError
from batchlab.schedulers.base import Given, Scheduler
from batchlab.schedulers.continuous import ContinuousConfig, ContinuousScheduler
from batchlab.schedulers.dynamic import DynamicConfig, DynamicScheduler
from batchlab.schedulers.guard import Guarded
from batchlab.schedulers.naive import NaiveConfig, NaiveScheduler
from batchlab.schedulers.plugins import load_policy
from batchlab.schedulers.priority import PriorityConfig, PriorityScheduler
from batchlab.schedulers.sjf import SJFConfig, SJFScheduler
from batchlab.schedulers.vtc import VTCConfig, VTCScheduler

__all__ = ["SCHEDULERS", "ContinuousConfig", "ContinuousScheduler", "DynamicConfig", "DynamicScheduler", "Given",
           "NaiveConfig", "NaiveScheduler", "PriorityConfig", "PriorityScheduler", "SJFConfig", "SJFScheduler",
           "Scheduler", "VTCConfig", "VTCScheduler", "make_scheduler", "option_sections", "register",
           "scheduler_class", "unregister"]

SCHEDULERS: dict[str, type[Scheduler]] = {}


def register(cls: type[Scheduler]) -> type[Scheduler]:
    """Make `cls` a strategy named `cls.name` (usable as a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)) or cls.level not in ("request", "iteration"):
        raise TypeError(f"{cls!r} is not a Scheduler subclass with level 'request' or 'iteration'")
    SCHEDULERS[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a strategy registered at run time (a test's)."""
    SCHEDULERS.pop(name, None)


for _cls in (NaiveScheduler, DynamicScheduler, ContinuousScheduler, PriorityScheduler, SJFScheduler, VTCScheduler):
    register(_cls)


def option_sections() -> dict[str, type[Model]]:
    """Config section name -> options model, for every registered scheduler that has options."""
    return {name: cls.options_model for name, cls in SCHEDULERS.items() if cls.options_model is not None}


def scheduler_class(strategy: str) -> type[Scheduler]:
    """The class a strategy names; ConfigError if a policy of your own cannot be loaded."""
    return SCHEDULERS.get(strategy) or load_policy(strategy, SCHEDULERS)


def make_scheduler(strategy: str, cfg: RunConfig, given: Given = Given()) -> Scheduler:
    """Build a strategy's scheduler; a policy of your own runs behind the contract check."""
    cls = scheduler_class(strategy)
    if strategy in SCHEDULERS:
        return cls.from_config(cfg, given)
    try:
        inner = cls.from_config(cfg, given)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"strategies: policy '{strategy}': from_config() raised {type(e).__name__}: {e}") from None
    return Guarded(inner, strategy, cfg.continuous)
