"""What a strategy name stands for, for the files and reports that name it.

A strategy is a registered scheduler (schedulers/), the batching of a load target (`server`,
backends/), a managed baseline batchlab starts on the engine's model (`vllm`,
backends/baselines.py), or a policy of your own named by import path or entry point. Each describes itself;
this module only reads the registries, so the CSV order, the report's names and pairings and the
plots' colours never list strategies by hand. A name no registry knows (a policy of your own, read
back from a results directory) still gets an order, a title and a pairing.
"""
from __future__ import annotations

from dataclasses import dataclass

from batchlab.backends import TARGET, kinds
from batchlab.backends.baselines import BASELINES
from batchlab.schedulers import SCHEDULERS, ContinuousScheduler


@dataclass(frozen=True)
class StrategyInfo:
    name: str
    title: str                    # a sentence opens with it: "Naive batching ..."
    short: str                    # it opens a sentence alone: "SJF sustains ..."
    cap: str | None               # the dotted knob that caps its batch rows (None: unknown)
    color: str | None             # its colour in every plot (None: picked from its name)
    compared_with: str | None     # a policy: the strategy reports pair it with (None: every other)
    level: str | None             # "request", "iteration", or None (a load target batches for itself)
    batching: str = ""            # what a sentence calls its batching: "continuous batching", "vLLM"
    opening: str = ""             # the same at a sentence's start: "Continuous batching", "vLLM"


def _registered() -> dict[str, StrategyInfo]:
    out = {}
    for name, cls in SCHEDULERS.items():
        title = cls.title or _capital(name)
        out[name] = StrategyInfo(name, title, cls.short or title, cls.cap or None, cls.color, cls.compared_with, cls.level,
                                 f"{name} batching", f"{title} batching")
    for m in kinds().values():
        if m.role == TARGET and m.strategy not in out:
            out[m.strategy] = StrategyInfo(m.strategy, m.title, _capital(m.strategy), None, m.color, None, None,
                                           f"{m.strategy} batching", f"{m.title} batching")
    for name, b in BASELINES.items():         # managed baselines: they batch for themselves too
        out[name] = StrategyInfo(name, b.title, b.title, None, b.color, None, None, b.title, b.title)
    return out


def _capital(name: str) -> str:
    return name[:1].upper() + name[1:]


def info(name: str) -> StrategyInfo:
    """The strategy's description; a policy of your own is paired with FCFS continuous batching,
    whose machinery policies usually extend."""
    known = _registered().get(name)
    if known is not None:
        return known
    return StrategyInfo(name, name, _capital(name), None, None, ContinuousScheduler.name, None, f"{name} batching",
                        f"{name} batching")


def rank(name: str) -> tuple[int, str]:
    """Registered strategies in registration order (naive, dynamic, continuous, priority, sjf,
    vtc, then load targets' `server`, then managed baselines), then policies of your own by name."""
    order = list(_registered())
    return (order.index(name) if name in order else len(order)), name
