"""The simulator's check on the closed form: search the batch cap, then count replicas.

One replica at saturation for every cap on a grid gives throughput and p95 TPOT per cap; the cap
is the largest whose TPOT-like SLOs hold (bisected between grid points), or, with no such SLO, the
start of the throughput plateau. That cap then runs at the target traffic behind a router, the
replica count stepped until every SLO holds and the replicas keep up with what arrives.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from pydantic import ValidationError

from batchlab.backends.cost import StepCost
from batchlab.core.config import RunConfig, format_error
from batchlab.errors import ConfigError
from batchlab.tune.closed_form import ClosedForm, step_model
from batchlab.tune.target import BATCH_BOUND, Target, mean_length


@dataclass
class SimPoint:
    cap: int
    replicas: int
    rate: float                      # offered req/s
    summary: dict[str, Any]
    served_ratio: float              # tokens served / tokens offered inside the measured window
    served_tok_s: float              # tokens served per second inside that window (sustained throughput)
    slo_ok: dict[str, bool] = field(default_factory=dict)

    @property
    def keeps_up(self) -> bool:
        return self.served_ratio >= 0.95

    @property
    def holds(self) -> bool:
        return self.keeps_up and all(self.slo_ok.values())


# ---------------------------------------------------------------- one simulated setting
def sim_config(target: Target, cap: int, replicas: int, rate: float, max_wait_ms: float) -> RunConfig:
    p_max = target.prompt_len.high or target.prompt_len.value or 8192
    tree = {
        "backend": {"kind": "sim", "replicas": replicas, "router": target.router},
        "strategies": [target.strategy],
        "naive": {"batch_size": cap},
        "dynamic": {"max_batch_size": cap, "max_wait_ms": max_wait_ms},
        "continuous": {"max_num_seqs": cap, "max_num_batched_tokens": max(8192, p_max)},
        "traffic": {"arrival": "poisson", "rates": [rate], "duration_s": target.duration_s,
                    "warmup_s": target.warmup_s, "seed": target.seed,
                    "prompt_len": target.prompt_len.model_dump(exclude_none=True),
                    "output_len": target.output_len.model_dump(exclude_none=True)},
        "report": False,
    }
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:       # e.g. a tuned rate past the per-point request cap
        raise ConfigError(f"tune: a simulated check is out of bounds: {format_error(e)}") from None


def simulate(cost: StepCost, target: Target, cap: int, replicas: int, rate: float,
             slos: dict[str, float], max_wait_ms: float = 0.0) -> SimPoint:
    from batchlab.backends.simulated import SimulatedBackend
    from batchlab.run.point import run_point
    target = settled(cost, target, cap)
    cfg = sim_config(target, cap, replicas, rate, max_wait_ms)
    res = run_point(cfg, target.strategy, rate, 0, SimulatedBackend(cost))
    s = res.summary
    ok = {k: bool(s.get(k, float("nan")) <= v) for k, v in slos.items()}
    return SimPoint(cap, replicas, rate, s, *served(res.requests, target), slo_ok=ok)


def settled(cost: StepCost, target: Target, cap: int) -> Target:
    """Warm-up long enough for two full-batch lifetimes, so the measured window sees steady state
    (a shorter one starts with too few requests in flight and undercounts what is served)."""
    p, o = mean_length(target.prompt_len), mean_length(target.output_len)
    fixed, per_seq = step_model(cost, p, o)
    return replace(target, warmup_s=max(target.warmup_s, 2 * o * (fixed + cap * per_seq)))


def served(requests, target: Target) -> tuple[float, float]:
    """Token stamps inside [warm-up, end of arrivals]: over tokens asked for by arrivals in it
    (~1 when the replicas keep up, < 1 when a queue builds), and per second.
    NOTE: not the summary's throughput, whose window includes the drain after the last arrival."""
    lo, hi = target.warmup_s, target.warmup_s + target.duration_s
    offered = sum(r.max_new_tokens for r in requests if lo <= r.arrival_time < hi)
    served = sum(int(np.count_nonzero((np.asarray(r.token_times) >= lo) & (np.asarray(r.token_times) < hi)))
                 for r in requests)
    return (served / offered if offered else float("nan")), served / target.duration_s


def default_max_wait_ms(cap: int, target: Target, replicas: int) -> float:
    """Dynamic batching's age trigger: the time a replica's share of the traffic takes to fill a
    batch, but never more than half a TTFT budget (the wait is part of every TTFT)."""
    fill = (cap - 1) / (target.qps / replicas) * 1e3
    ttft = [v * 1e3 for k, v in target.slos.items() if k.startswith("ttft")]
    return round(min([fill] + [t / 2 for t in ttft]), 1)


# ---------------------------------------------------------------- the cap: one saturated replica
def cap_grid(cf: ClosedForm, limit: int) -> list[int]:
    """Powers of two up to twice the chosen cap, plus the cap and its neighbours."""
    top = min(limit, max(4, 2 * cf.cap))
    grid = {1, cf.cap, max(1, cf.cap - 1), min(top, cf.cap + 1), top}
    grid |= {2**k for k in range(12) if 2**k <= top}
    grid |= {int(round(x)) for x in np.linspace(1, top, 9)}
    return sorted(grid)


def sweep_caps(cost: StepCost, target: Target, cf: ClosedForm, grid: list[int]) -> list[SimPoint]:
    """One replica at saturation for every cap: what it sustains, and its TPOT with a full batch."""
    batch_slos = {k: v for k, v in target.slos.items() if k.split("_")[0] in BATCH_BOUND}
    out = []
    for cap in grid:
        capacity_req_s = cap / (cf.step(cap) / 1e3) / mean_length(target.output_len)
        rate = min(target.qps, 1.25 * capacity_req_s)
        out.append(simulate(cost, target, cap, 1, rate, batch_slos, max_wait_ms=0.0))
    return out


def pick_cap(cost: StepCost, target: Target, cf: ClosedForm, sweep: list[SimPoint]) -> tuple[int, str]:
    """Largest cap whose full batch holds the TPOT-like SLOs at saturation (grid, then bisection);
    with no such SLO, the smallest cap within 5 % of the best simulated throughput (the plateau)."""
    if not any(k.split("_")[0] in BATCH_BOUND for k in target.slos):
        best = max(p.served_tok_s for p in sweep)
        return min(p.cap for p in sweep if p.served_tok_s >= 0.95 * best), "throughput plateau"
    ok = [p.cap for p in sweep if all(p.slo_ok.values())]
    if not ok:
        return 1, "no cap holds the SLO, even 1"
    lo = max(ok)
    failing = [p.cap for p in sweep if p.cap > lo]
    hi = min(failing) if failing else None
    if hi is None:
        return lo, "largest cap simulated"
    return bisect_cap(cost, target, cf, lo, hi), "largest cap whose simulated SLO holds"


def bisect_cap(cost: StepCost, target: Target, cf: ClosedForm, lo: int, hi: int) -> int:
    """Between a grid cap that holds (lo) and the next that fails (hi): the largest that holds."""
    batch_slos = {k: v for k, v in target.slos.items() if k.split("_")[0] in BATCH_BOUND}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        rate = min(target.qps, 1.25 * mid / (cf.step(mid) / 1e3) / mean_length(target.output_len))
        if all(simulate(cost, target, mid, 1, rate, batch_slos).slo_ok.values()):
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------- the replicas: the target traffic
def check_replicas(cost: StepCost, target: Target, cap: int, start: int, max_extra: int = 8) -> tuple[list[SimPoint], int | None]:
    """Simulate the cap at the target traffic from `start` replicas: up until every SLO holds and
    the replicas keep up, then down while one fewer still does. Returns the runs and the count."""
    runs: dict[int, SimPoint] = {}

    def run(n: int) -> SimPoint:
        if n not in runs:
            runs[n] = simulate(cost, target, cap, n, target.qps, target.slos, default_max_wait_ms(cap, target, n))
        return runs[n]

    n = start
    while not run(n).holds and n < start + max_extra:
        n += 1
    if not run(n).holds:
        return sorted(runs.values(), key=lambda p: p.replicas), None
    while n > 1 and run(n - 1).holds:
        n -= 1
    run(n - 1) if n > 1 else None      # show the count that fails, for the report
    return sorted(runs.values(), key=lambda p: p.replicas), n
