"""What a twin predicts that a live server can be measured against, judged as the server is.

- The sustained rate: the search a live server gets (core/search.py from the same bracket, to the
  same tolerance), each point the same seeded trace a client would send, run on the twin in
  virtual time and judged by the same verdict (core/sustain.py `judge`).
- A saturated burst: n requests at once, its steady-middle throughput and median TPOT, with any of
  the twin's limits changed (a what-if: the server at another sequence cap, say).
- The twin at the machine's speed now: its step costs scaled until its burst matches one measured
  on the server (`scaled_to_burst`).
Both run in milliseconds, so a campaign asks them before it spends minutes measuring.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from batchlab.backends.simulated import SimulatedBackend
from batchlab.calibrate.validate import sim_cost
from batchlab.core.config import RunConfig, SLOConfig, TrafficConfig
from batchlab.core.metrics import summarize
from batchlab.core.request import Request
from batchlab.core.search import knee, significant
from batchlab.core.sustain import burst_figures, judge
from batchlab.core.trace_item import TraceItem
from batchlab.core.traffic import build_trace, fixed_burst
from batchlab.run.point import run_point


@dataclass(frozen=True)
class Twin:
    """A twin config (as `batchlab profile` writes it) ready to replay traces; `scale` multiplies
    every step cost (a machine measured slower than at the profile: validate's drift factor)."""
    cfg: RunConfig
    scale: float = 1.0

    def with_limits(self, **limits: Any) -> Twin:
        """The same twin with continuous-section limits replaced (e.g. max_num_seqs=8)."""
        section = self.cfg.continuous.model_copy(update=limits)
        return Twin(self.cfg.model_copy(update={"continuous": section}), self.scale)

    def replay(self, trace: list[TraceItem], traffic: TrafficConfig | None = None, slo: SLOConfig | None = None,
               rate: float = 1.0) -> list[Request]:
        """The trace on the twin, in virtual time: its requests, times from the run's start."""
        cfg = self.cfg.model_copy(update={"traffic": traffic or self.cfg.traffic, "slo": slo or self.cfg.slo})
        backend = SimulatedBackend(sim_cost(cfg, cfg.backend.cost(), self.scale))
        return run_point(cfg, cfg.strategies[0], rate, 0, backend, trace).requests


def predicted_knee(twin: Twin, traffic: TrafficConfig, slo: SLOConfig, bracket: tuple[float, float],
                   tolerance: float, max_points: int) -> dict[str, Any]:
    """The highest rate the twin sustains, searched and judged as a live server's is (the fields
    of a live search's record: sustained_rate, failed_rate, probes, settled, points)."""
    lo, hi = traffic.warmup_s, traffic.warmup_s + traffic.duration_s
    points: list[dict[str, Any]] = []

    def holds(rate: float) -> bool:
        reqs = twin.replay(build_trace(traffic, rate), traffic, slo, rate)
        v = judge(reqs, lo, hi, slo).record()
        s = summarize([r for r in reqs if r.arrival_time >= lo], slo)
        points.append({"rate": rate, "ttft_p99": s["ttft_p99"], "tpot_p99": s["tpot_p99"], **v})
        return v["sustained"]

    b = knee(holds, *bracket, tolerance=tolerance, max_probes=max_points, snap=significant(3))
    return {"sustained_rate": b.lo, "failed_rate": b.hi, "probes": [r for r, _ in b.probes], "settled": b.settled,
            "points": points}


def predicted_burst(twin: Twin, n: int, prompt_len: int, output_len: int, **limits: Any) -> dict[str, float]:
    """The burst on the twin, with `limits` replacing its own (the what-if)."""
    return burst_figures((twin.with_limits(**limits) if limits else twin).replay(fixed_burst(n, prompt_len, output_len)))


def scaled_to_burst(twin: Twin, server_tok_s: float, n: int, prompt_len: int, output_len: int) -> Twin:
    """The twin with its step costs scaled so that its burst of n requests runs at `server_tok_s`
    (measured on the server just now). NOTE: throughput is not exactly inverse to the step scale
    (a front end's fixed time, the burst's ends), so the first guess is corrected once by
    replaying the burst at it."""
    factor = twin.scale * predicted_burst(twin, n, prompt_len, output_len)["tok_s"] / server_tok_s
    first = replace(twin, scale=factor)
    return replace(twin, scale=factor * predicted_burst(first, n, prompt_len, output_len)["tok_s"] / server_tok_s)
