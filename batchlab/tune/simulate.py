"""The simulator's check on the closed form: search the batch cap, then count replicas.

One replica at saturation for every cap on a grid gives throughput and p95 TPOT per cap; the cap
is the largest whose TPOT-like SLOs hold (bisected between grid points), or, with no such SLO, the
start of the throughput plateau. That cap then runs at the target traffic behind a router, the
replica count stepped until every SLO holds and the replicas keep up with what arrives ("keep
up": core/sustain.py's threshold, the report's, on the work served over the measured window, and
a queue that does not grow: the traffic below what the replicas complete saturated, from a burst
of the same requests; a TPOT-only SLO never sees a queue, so these are the checks that do). Every simulated setting is a
pure function (`simulate`), so an executor runs the grid, each bisection round's probes and each
round of replica counts side by side (run/executors.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from pydantic import ValidationError

from batchlab.backends.cost import StepCost
from batchlab.core.config import RunConfig, format_error
from batchlab.core.search import Bracket
from batchlab.core.sustain import served_share, stable, sustains
from batchlab.errors import ConfigError
from batchlab.run.config import config_model
from batchlab.run.executors import Executor, LocalExecutor
from batchlab.schedulers import ContinuousScheduler, DynamicScheduler
from batchlab.tune.burst import saturated
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
    saturated_req_s: float = float("nan")   # what it completes with a queue that never empties (NaN: not measured)

    @property
    def keeps_up(self) -> bool:
        """The report's throughput condition, and a queue that does not grow: the rate is below
        what the setting serves saturated (core/sustain.py); the SLO half is `slo_ok`, whose
        percentile limits are the tuner's own way of stating an SLO."""
        return bool(sustains(float("nan"), self.served_ratio, with_slo=False)) and stable(self.rate, self.saturated_req_s)

    @property
    def holds(self) -> bool:
        return self.keeps_up and all(self.slo_ok.values())


# ---------------------------------------------------------------- one simulated setting
def sim_config(target: Target, cap: int, replicas: int, rate: float, max_wait_ms: float) -> RunConfig:
    """The run config of one simulated setting: the cap on the strategy's knob, a token budget every
    prompt fits in, dynamic batching's age trigger, the target's traffic at `rate`."""
    p_max = target.prompt_len.high or target.prompt_len.value or 8192
    section, key = target.knob.split(".")
    tree = {
        "backend": {"kind": "sim", "replicas": replicas, "router": target.router},
        "strategies": [target.strategy],
        section: {key: cap},
        ContinuousScheduler.name: {"max_num_batched_tokens": max(8192, p_max)} | ({key: cap} if section == "continuous" else {}),
        DynamicScheduler.name: {"max_wait_ms": max_wait_ms} | ({key: cap} if section == "dynamic" else {}),
        "traffic": {"arrival": target.arrival, "burstiness": target.burstiness, "rates": [rate],
                    "duration_s": target.duration_s, "warmup_s": target.warmup_s, "seed": target.seed,
                    "prompt_len": target.prompt_len.model_dump(exclude_none=True),
                    "output_len": target.output_len.model_dump(exclude_none=True)},
        "report": False,
    }
    try:
        return config_model().model_validate(tree)
    except ValidationError as e:       # e.g. a tuned rate past the per-point request cap
        raise ConfigError(f"tune: a simulated check is out of bounds: {format_error(e)}") from None


def simulate(cost: StepCost, target: Target, cap: int, replicas: int, rate: float,
             slos: dict[str, float], max_wait_ms: float = 0.0, stability: bool = False) -> SimPoint:
    """One setting at `rate`; with `stability`, also its saturated rate (a second, burst run)."""
    from batchlab.backends.simulated import SimulatedBackend
    from batchlab.run.point import run_point
    target = settled(cost, target, cap)
    cfg = sim_config(target, cap, replicas, rate, max_wait_ms)
    res = run_point(cfg, target.strategy, rate, 0, SimulatedBackend(cost))
    s = res.summary
    ok = {k: bool(s.get(k, float("nan")) <= v) for k, v in slos.items()}
    mu = saturated(cfg, target.strategy, SimulatedBackend(cost)) if stability else float("nan")
    return SimPoint(cap, replicas, rate, s, *served(res.requests, target), slo_ok=ok, saturated_req_s=mu)


def settled(cost: StepCost, target: Target, cap: int) -> Target:
    """Warm-up long enough for two full-batch lifetimes, so the measured window sees steady state
    (a shorter one starts with too few requests in flight and undercounts what is served)."""
    p, o = mean_length(target.prompt_len), mean_length(target.output_len)
    fixed, per_seq = step_model(cost, p, o)
    return replace(target, warmup_s=max(target.warmup_s, 2 * o * (fixed + cap * per_seq)))


def served(requests, target: Target) -> tuple[float, float]:
    """Over the measured window [warm-up, end of arrivals]: served over offered tokens
    (core/sustain.py), and tokens served per second (what the replicas sustain)."""
    lo, hi = target.warmup_s, target.warmup_s + target.duration_s
    share = served_share(requests, lo, hi)
    offered = sum(r.max_new_tokens for r in requests if lo <= r.arrival_time < hi)
    return share, share * offered / target.duration_s if offered else 0.0


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


def run_all(executor: Executor, calls: list[tuple]) -> list[SimPoint]:
    """simulate(*call) for every call, side by side on the executor; results in the calls' order."""
    out: list[SimPoint | None] = [None] * len(calls)
    for fin in executor.map(simulate, calls):
        if fin.error is not None:
            raise RuntimeError(f"tune: a simulated check was lost: {fin.error}")
        out[fin.index] = fin.value
    return out


def saturation_rate(cf: ClosedForm, target: Target, cap: int) -> float:
    """The target traffic, or 1.25x what one replica at this cap can serve if that is less."""
    return min(target.qps, 1.25 * cap / (cf.step(cap) / 1e3) / mean_length(target.output_len))


def batch_slos(target: Target) -> dict[str, float]:
    return {k: v for k, v in target.slos.items() if k.split("_")[0] in BATCH_BOUND}


def sweep_caps(cost: StepCost, target: Target, cf: ClosedForm, grid: list[int],
               executor: Executor | None = None) -> list[SimPoint]:
    """One replica at saturation for every cap: what it sustains, and its TPOT with a full batch."""
    calls = [(cost, target, cap, 1, saturation_rate(cf, target, cap), batch_slos(target), 0.0) for cap in grid]
    return run_all(executor or LocalExecutor(), calls)


def pick_cap(cost: StepCost, target: Target, cf: ClosedForm, sweep: list[SimPoint],
             executor: Executor | None = None) -> tuple[int, str]:
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
    return bisect_cap(cost, target, cf, lo, hi, executor or LocalExecutor()), "largest cap whose simulated SLO holds"


def bisect_cap(cost: StepCost, target: Target, cf: ClosedForm, lo: int, hi: int, executor: Executor) -> int:
    """Between a grid cap that holds (lo) and the next that fails (hi): the largest that holds.
    Each round probes as many caps as the executor runs at once, evenly inside (lo, hi): plain
    bisection on one core, fewer rounds on a cluster; the same answer while holding is monotone."""
    bracket = Bracket(lo, hi, 0.0, executor.parallelism, geometric=False, widen=False, snap=math.floor,
                      probes=[(lo, True), (hi, False)])
    while mids := bracket.next_round():
        probes = run_all(executor, [(cost, target, m, 1, saturation_rate(cf, target, m), batch_slos(target))
                                    for m in mids])
        for m, p in zip(mids, probes):
            bracket.record(m, all(p.slo_ok.values()))
    return int(bracket.lo)


# ---------------------------------------------------------------- the replicas: the target traffic
def check_replicas(cost: StepCost, target: Target, cap: int, start: int, max_extra: int = 8,
                   executor: Executor | None = None) -> tuple[list[SimPoint], int | None]:
    """Simulate the cap at the target traffic from `start` replicas: up until every SLO holds and
    the replicas keep up, then down while one fewer still does. Returns the runs and the count.
    Each round simulates as many counts as the executor runs at once (one at a time locally)."""
    executor = executor or LocalExecutor()
    width = executor.parallelism
    runs: dict[int, SimPoint] = {}

    def run(ns: list[int]) -> None:
        todo = [n for n in ns if n not in runs and n >= 1]
        calls = [(cost, target, cap, n, target.qps, target.slos, default_max_wait_ms(cap, target, n), True) for n in todo]
        runs.update(zip(todo, run_all(executor, calls)))

    n, top = start, start + max_extra
    run([start])
    while not runs[n].holds and n < top:
        run(list(range(n + 1, min(n + width, top) + 1)))
        n = next((m for m in range(n + 1, top + 1) if m in runs and runs[m].holds), max(m for m in runs if m <= top))
    if not runs[n].holds:
        return sorted(runs.values(), key=lambda p: p.replicas), None
    while n > 1 and not (n - 1 in runs and not runs[n - 1].holds):
        run(list(range(n - 1, max(0, n - width - 1), -1)))
        below = [m for m in range(n - 1, 0, -1) if m in runs]
        fewer = [m for m in below if runs[m].holds and all(runs[x].holds for x in below if x > m)]
        if not fewer:
            break
        n = min(fewer)
    return sorted(runs.values(), key=lambda p: p.replicas), n
