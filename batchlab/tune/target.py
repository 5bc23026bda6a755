"""What `batchlab tune` aims at: the traffic, its SLOs, and the step-time model to size it with.

A Target is the peak traffic (req/s, prompt and output lengths) plus the latency SLOs as summary
keys (tpot_p95 -> seconds). The step-time model is a measured profile, a simulator preset, or the
seed's linear t(b) = step_ms + b x per_seq_ms. This file turns the command's text into those, with
errors a user can act on; mean_length is the one number per length distribution the closed form uses.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchlab.backends.cost import StepCost
from batchlab.backends.presets import load_cost
from batchlab.core.config import LengthDist
from batchlab.errors import ConfigError

SLO_KEY = re.compile(r"^(ttft|tpot|itl|e2e|queue_wait)_(p50|p90|p95|p99|mean)$")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
BATCH_BOUND = ("tpot", "itl")       # SLOs a batch cap controls; the rest need capacity (replicas)
KNOB = {"continuous": "continuous.max_num_seqs", "dynamic": "dynamic.max_batch_size", "naive": "naive.batch_size"}


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


def parse_length(text: str, flag: str) -> LengthDist:
    """'200', or a mapping like '{dist: uniform, low: 50, high: 300}'."""
    import yaml
    from pydantic import ValidationError

    from batchlab.core.config import _as_length
    try:
        return LengthDist.model_validate(_as_length(yaml.safe_load(text)))
    except (yaml.YAMLError, ValidationError, ValueError) as e:
        why = e.errors()[0]["msg"].removeprefix("Value error, ") if isinstance(e, ValidationError) else str(e)
        raise ConfigError(f"{flag} {text!r}: expected a token count like 200 or "
                          f"'{{dist: uniform, low: 50, high: 300}}' ({why})") from None


def linear_cost(step_ms: float, per_seq_ms: float) -> StepCost:
    """The seed's model t(b) = step_ms + b x per_seq_ms, with no memory limit."""
    return StepCost(step_ms / 1e3, 0.0, 0.0, 0.0, per_seq_ms / 1e3, kv_bytes_per_token=1,
                    kv_budget_bytes=1 << 50, name="linear",
                    description=f"linear: {step_ms:g} ms + {per_seq_ms:g} ms per sequence")


def choose_cost(profile: str | None, preset: str | None, step_ms: float | None, per_seq_ms: float | None) -> StepCost:
    given = [x for x in (profile, preset, step_ms) if x is not None]
    if len(given) != 1:
        raise ConfigError("give exactly one step-time model: --profile FILE, --preset NAME, or --step-ms X [--per-seq-ms Y]")
    if step_ms is not None:
        if step_ms <= 0 or (per_seq_ms or 0) < 0:
            raise ConfigError("--step-ms must be > 0 and --per-seq-ms >= 0")
        return linear_cost(step_ms, per_seq_ms or 0.0)
    if per_seq_ms is not None:
        raise ConfigError("--per-seq-ms goes with --step-ms")
    if profile is not None and not Path(profile).is_file():
        raise ConfigError(f"--profile: file not found: {profile}")
    return load_cost(preset or "", profile)


@functools.lru_cache(maxsize=16)
def mean_length(d: LengthDist) -> float:
    from batchlab.core.traffic import sample_lengths
    lens, _ = sample_lengths(d, 20_000, np.random.default_rng(0), "gpt")
    return float(np.mean(lens))
