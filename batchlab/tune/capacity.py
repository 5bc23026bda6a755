"""The capacity search: the highest rate each strategy sustains, by bisection over simulated points.

Like vLLM's `bench sweep serve_sla`, but on the simulator and with the report's rule
(core/sustain.py): a rate holds when, in the medians over the config's repeats, at least
ATTAINMENT of the measured requests meet every threshold of the config's `slo` section, the
work served over the measured window reaches SERVED of the work offered, and the rate is below
what the strategy completes saturated. Each strategy keeps a bracket (core/search.py, the one
bracket-and-bisect search): --low, then --high, then `width` rates evenly inside per round, every
strategy's probes sent to the executor together (one per round locally: plain bisection; k on a
cluster: a (k+1)-section), until hi / lo - 1 is within the tolerance.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from batchlab.core.config import RunConfig
from batchlab.core.search import Bracket
from batchlab.core.sustain import served_share, stable, sustains
from batchlab.errors import ConfigError
from batchlab.run.executors import Executor, LocalExecutor
from batchlab.tune.burst import saturated


@dataclass(frozen=True)
class Probe:
    """One rate of one strategy: medians over repeats, and the verdict."""
    strategy: str
    rate: float                      # offered req/s (sessions/s with traffic.sessions)
    attainment: float                # share of measured requests meeting every SLO threshold
    served: float                    # work served over work offered in the measured window
    holds: bool
    ttft_p99: float                  # seconds, for the table
    tpot_p50: float
    round: int                       # the search round that probed it (0: the opening's first)


@dataclass
class Search:
    """One strategy's bracket (core/search.py) and every probe it took."""
    strategy: str
    bracket: Bracket
    probes: list[Probe] = field(default_factory=list)
    saturated_req_s: float = float("nan")    # completed per second with a queue that never empties

    @property
    def lo(self) -> float | None:
        """The highest rate that held below every rate that failed (None: not even the lowest)."""
        return self.bracket.lo

    @property
    def hi(self) -> float | None:
        """The lowest rate that failed (None: every rate probed held)."""
        return self.bracket.hi

    def add(self, probe: Probe) -> None:
        self.probes.append(probe)
        self.bracket.record(probe.rate, probe.holds)


@dataclass(frozen=True)
class CapacityPlan:
    cfg: RunConfig
    strategies: list[str]
    low: float                       # the opening's ends, req/s
    high: float
    tolerance: float                 # stop when hi / lo - 1 is within this
    width: int                       # rates probed per strategy per round

    def bracket(self) -> Bracket:
        """One strategy's search: arithmetic midpoints, and no widening past the opening's ends
        (a strategy that holds none, or all, of them is reported so: lower --low or raise --high)."""
        return Bracket(self.low, self.high, self.tolerance, self.width, geometric=False, widen=False)


def check_plan(cfg: RunConfig, strategies: list[str], low: float, high: float, tolerance: float, width: int) -> CapacityPlan:
    """Refuse what cannot be searched, before anything runs (one line each)."""
    if cfg.backend.kind != "sim":
        raise ConfigError(f"capacity: searches the simulator (backend.kind sim), not '{cfg.backend.kind}': every probe is a "
                          "point; on a real backend run a sweep over rates (batchlab run) instead")
    if cfg.traffic.arrival == "trace":
        raise ConfigError("capacity: a replayed trace sets its own rate; use a synthetic arrival (poisson, gamma, constant)")
    if not 0 < low < high:
        raise ConfigError(f"capacity: need 0 < --low < --high (got {low:g}, {high:g})")
    if not 0 < tolerance < 1:
        raise ConfigError(f"capacity: --tolerance must be between 0 and 1 (got {tolerance:g})")
    if width < 1:
        raise ConfigError(f"capacity: --probes must be at least 1 (got {width})")
    unknown = [s for s in strategies if s not in cfg.strategies]
    if unknown:
        raise ConfigError(f"capacity: --strategy {', '.join(unknown)} is not in the config's strategies ({', '.join(cfg.strategies)})")
    from batchlab.run.config import load_config
    load_config(None, [], base=cfg.model_dump(mode="json") | {"traffic": cfg.traffic.model_dump(mode="json") | {"rates": [high]}})
    return CapacityPlan(cfg, strategies or list(cfg.strategies), low, high, tolerance, width)


def probe_point(cfg: RunConfig, strategy: str, rate: float, repeat: int) -> dict[str, float]:
    """One simulated point at `rate`: the numbers the rule reads. A pure function (a Ray task)."""
    from batchlab.backends import make_backend
    from batchlab.run.point import run_point
    res = run_point(cfg, strategy, rate, repeat, make_backend(cfg))
    lo = cfg.traffic.warmup_s
    s = res.summary
    return {"attainment": s.get("slo_attainment", float("nan")), "ttft_p99": s.get("ttft_p99", float("nan")),
            "tpot_p50": s.get("tpot_p50", float("nan")), "served": served_share(res.requests, lo, lo + cfg.traffic.duration_s)}


def saturation_point(cfg: RunConfig, strategy: str) -> float:
    """What `strategy` completes per second with a queue that never empties. A pure function."""
    return saturated(cfg, strategy)


def search(plan: CapacityPlan, executor: Executor | None = None, on_round=None) -> list[Search]:
    """Every strategy's search, round by round; each round's probes go out together. First, each
    strategy's saturated rate: no rate at or above it holds, however the window's numbers read."""
    executor = executor or LocalExecutor()
    found = {s: Search(s, plan.bracket()) for s in plan.strategies}
    for fin in executor.map(saturation_point, [(plan.cfg, s) for s in plan.strategies]):
        if fin.error is not None:
            raise ConfigError(f"capacity: the saturation run of {plan.strategies[fin.index]} was lost: {fin.error}")
        found[plan.strategies[fin.index]].saturated_req_s = fin.value
    rnd = 0
    while rates := {s: rs for s, f in found.items() if (rs := f.bracket.next_round())}:
        _probe(plan, executor, rates, found, rnd)
        if on_round:
            on_round(rnd, list(found.values()))
        rnd += 1
    return list(found.values())


def _probe(plan: CapacityPlan, executor: Executor, rates: dict[str, list[float]], found: dict[str, Search], rnd: int) -> None:
    reps = range(plan.cfg.traffic.repeats)
    calls = [(plan.cfg, s, r, k) for s, rs in rates.items() for r in rs for k in reps]
    got: dict[tuple[str, float], list[dict]] = {}
    for fin in executor.map(probe_point, calls):
        if fin.error is not None:
            s, r, _ = calls[fin.index][1:]
            raise ConfigError(f"capacity: the probe of {s} at {r:g} req/s was lost: {fin.error}")
        _, s, r, _ = calls[fin.index]
        got.setdefault((s, r), []).append(fin.value)
    with_slo = any(v is not None for v in plan.cfg.slo.model_dump().values())
    for (s, r), runs in sorted(got.items()):
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        held = bool(sustains(med["attainment"], med["served"], with_slo)) and stable(r, found[s].saturated_req_s)
        found[s].add(Probe(s, r, med["attainment"], med["served"], held, med["ttft_p99"], med["tpot_p50"], rnd))


def summary_lines(results: list[Search], plan: CapacityPlan, unit: str = "req/s") -> list[str]:
    lines = []
    for f in results:
        n, rounds = len(f.probes), 1 + max(p.round for p in f.probes)
        if f.lo is None:
            lines.append(f"{f.strategy}: sustains none of the rates tried (fails at {plan.low:g} {unit}, the lowest); lower --low")
        elif f.hi is None:
            lines.append(f"{f.strategy}: sustains {f.lo:g} {unit}, the highest tried; raise --high to find its limit")
        else:
            why = _why(next(p for p in f.probes if p.rate == f.hi), f.saturated_req_s)
            lines.append(f"{f.strategy}: sustains {f.lo:g} {unit}; fails at {f.hi:g} ({why}); {rounds} rounds, {n} probes")
    return lines


def _why(p: Probe, saturated_req_s: float = float("nan")) -> str:
    from batchlab.core.sustain import ATTAINMENT, SERVED
    out = []
    if not stable(p.rate, saturated_req_s):
        out.append(f"at or above the {saturated_req_s:.4g} req/s it completes saturated: the queue grows")
    if not math.isnan(p.attainment) and p.attainment < ATTAINMENT:
        out.append(f"SLO met by {100 * p.attainment:.0f} % of requests")
    if not p.served >= SERVED and not out:
        out.append(f"served {100 * p.served:.0f} % of the offered work: the queue grows")
    return "; ".join(out) or "rule not met"
