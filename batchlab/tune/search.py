"""Tune to a latency budget: the largest batch that keeps the SLO, then replicas for the traffic.

The sizing recipe, one file per part: target.py (the traffic, SLOs and step-time model),
closed_form.py (t(b) = fixed + b x per-sequence, the largest b under the TPOT budget and the replicas
for qps x output tokens/s), simulate.py (the simulator checks the cap on a grid at saturation, then
the replica count at the target traffic), this file (the search's outline and its result),
report.py and plot.py (what it says), command.py (`batchlab tune`).
"""
from __future__ import annotations

from dataclasses import dataclass

from batchlab.backends.cost import StepCost
from batchlab.run.executors import Executor, LocalExecutor
from batchlab.schedulers import DynamicScheduler
from batchlab.tune.closed_form import ClosedForm, closed_form, replicas_for
from batchlab.tune.simulate import SimPoint, cap_grid, check_replicas, default_max_wait_ms, pick_cap, simulate, sweep_caps
from batchlab.tune.target import Target


@dataclass
class TuneResult:
    cost: StepCost
    target: Target
    closed: ClosedForm
    sweep: list[SimPoint]
    cap: int
    cap_reason: str
    closed_check: SimPoint           # the closed-form cap and replica count, simulated at the target traffic
    replica_runs: list[SimPoint]
    replicas: int | None             # fewest replicas that hold every SLO at the chosen cap (None: none tried did)
    max_wait_ms: float | None        # dynamic only


def tune(cost: StepCost, target: Target, executor: Executor | None = None) -> TuneResult:
    """Closed form, saturated sweep over caps, choice, then the replica check at the target traffic.
    `executor` runs the simulated checks (run/executors.py; default: one after another here)."""
    executor = executor or LocalExecutor()
    cf = closed_form(cost, target)
    sweep = sweep_caps(cost, target, cf, cap_grid(cf, cf.cap if cf.limited_by == "memory" else target.max_cap), executor)
    cap, why = pick_cap(cost, target, cf, sweep, executor)
    runs, n = check_replicas(cost, target, cap, replicas_for(cf, cap), executor=executor)
    closed_check = next((p for p in runs if p.cap == cf.cap and p.replicas == cf.replicas), None)
    if closed_check is None:
        closed_check = simulate(cost, target, cf.cap, cf.replicas, target.qps, target.slos,
                                default_max_wait_ms(cf.cap, target, cf.replicas))
    wait = default_max_wait_ms(cap, target, n or cf.replicas) if target.strategy == DynamicScheduler.name else None
    return TuneResult(cost, target, cf, sweep, cap, why, closed_check, runs, n, wait)
