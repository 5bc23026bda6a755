"""What `batchlab tune` aims at: the traffic, its SLOs, and the step-time model to size it with.

A Target is the peak traffic (req/s, prompt and output lengths) plus the latency SLOs as summary
keys (tpot_p95 -> seconds), read from a run config: its highest rate is the peak, its simulator
backend the step-time model (a preset, a measured profile, or `backend.linear`: t(b) = step_ms +
b x per_seq_ms), its `slo` section the SLO unless `--slo` gives percentile limits. Errors name the
key to change; mean_length is the one number per length distribution the closed form uses.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from batchlab.backends.cost import StepCost
from batchlab.backends.simulated import SimOptions
from batchlab.core.config import LengthDist, RunConfig
from batchlab.core.sustain import ATTAINMENT
from batchlab.errors import ConfigError
from batchlab.schedulers import SCHEDULERS, ContinuousScheduler, scheduler_class

SLO_KEY = re.compile(r"^(ttft|tpot|itl|e2e|queue_wait)_(p50|p90|p95|p99|mean)$")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
BATCH_BOUND = ("tpot", "itl")       # SLOs a batch cap controls; the rest need capacity (replicas)
SLO_PERCENTILE = f"p{round(100 * ATTAINMENT)}"   # the config's thresholds hold for this share of requests


@dataclass(frozen=True)
class Target:
    qps: float                       # requests/s at peak
    prompt_len: LengthDist
    output_len: LengthDist
    slos: dict[str, float]           # summary key (e.g. tpot_p95) -> limit in seconds
    strategy: str = "continuous"
    router: str = "least_outstanding"
    duration_s: float = 60.0         # simulated seconds of traffic per check, after warm-up
    warmup_s: float = 10.0
    seed: int = 0
    max_cap: int = 1024
    arrival: str = "poisson"         # poisson, gamma or constant
    burstiness: float = 1.0          # gamma's shape

    @property
    def knob(self) -> str:
        """The dotted config key the cap sets (`continuous.max_num_seqs`)."""
        return scheduler_class(self.strategy).cap


def target_of(cfg: RunConfig, slos: tuple[str, ...] = (), strategy: str | None = None,
              max_cap: int = 1024) -> tuple[Target, StepCost]:
    """What `batchlab tune CONFIG` sizes: the config's peak rate and lengths under its SLO (or the
    `--slo` percentile limits), for `strategy` (default: continuous if listed, else the first)."""
    if not isinstance(cfg.backend, SimOptions):
        raise ConfigError(f"tune: sizes in simulation: backend.kind sim (a preset, backend.profile or backend.linear), "
                          f"not '{cfg.backend.kind}'")
    t = cfg.traffic
    if t.arrival in ("trace", "closed") or t.sessions is not None:
        raise ConfigError("tune: needs synthetic arrivals at a rate (poisson, gamma or constant), without sessions")
    strategy, limits = strategy_and_slos(cfg, "tune", slos, strategy, "tpot_p95=50ms")
    if max_cap < 1:
        raise ConfigError(f"tune: --max-cap must be at least 1 (got {max_cap})")
    target = Target(max(t.rates), t.prompt_len, t.output_len, limits, strategy, cfg.backend.router, t.duration_s,
                    t.warmup_s, t.seed, max_cap, t.arrival, t.burstiness)
    return target, cfg.backend.cost()


def strategy_and_slos(cfg: RunConfig, command: str, slos: tuple[str, ...], strategy: str | None,
                      example: str) -> tuple[str, dict[str, float]]:
    """The strategy a sizing command sizes (default: continuous if the config lists it, else its
    first) and its percentile SLOs (the `--slo` limits, else the config's thresholds); one line
    naming `command` for an unknown strategy or no SLO at all."""
    strategy = strategy or (ContinuousScheduler.name if ContinuousScheduler.name in cfg.strategies else cfg.strategies[0])
    if strategy not in SCHEDULERS:
        raise ConfigError(f"{command}: --strategy {strategy!r}: one of {', '.join(SCHEDULERS)}")
    limits = dict(parse_slo(s) for s in slos) or config_slos(cfg)
    if not limits:
        raise ConfigError(f"{command}: needs an SLO: set slo.ttft_s / slo.tpot_s / slo.e2e_s, or give --slo {example}")
    return strategy, limits


def config_slos(cfg: RunConfig) -> dict[str, float]:
    """The config's thresholds as percentile limits: slo.tpot_s = 0.05 -> tpot_p90 <= 50 ms (the
    share of requests that must meet a threshold, as the sustain rule counts it)."""
    return {f"{k.removesuffix('_s')}_{SLO_PERCENTILE}": v for k, v in cfg.slo.model_dump().items() if v is not None}


def parse_slo(text: str) -> tuple[str, float]:
    """'tpot_p95=50ms' -> ('tpot_p95', 0.05)."""
    m = re.fullmatch(r"\s*([a-z_0-9]+)\s*=\s*([0-9.eE+-]+)\s*(us|ms|s)\s*", text)
    if not m or not SLO_KEY.match(m.group(1)):
        raise ConfigError(f"--slo {text!r}: expected METRIC_PCT=VALUE with a unit, e.g. tpot_p95=50ms or "
                          "ttft_p99=2s (metrics: ttft, tpot, itl, e2e, queue_wait; pct: p50, p90, p95, p99, mean)")
    try:
        value = float(m.group(2)) * UNITS[m.group(3)]
    except ValueError:
        raise ConfigError(f"--slo {text!r}: {m.group(2)!r} is not a number") from None
    if not value > 0:
        raise ConfigError(f"--slo {text!r}: the limit must be > 0")
    return m.group(1), value


@functools.lru_cache(maxsize=16)
def mean_length(d: LengthDist) -> float:
    from batchlab.core.traffic import sample_lengths
    lens, _ = sample_lengths(d, 20_000, np.random.default_rng(0), "gpt")
    return float(np.mean(lens))
