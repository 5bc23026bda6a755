"""Seeded request traces: when requests arrive and how long their prompts and outputs are.

A trace depends only on (config, rate, repeat), never on the strategy, so every strategy sees
exactly the same requests. Arrival times are planned offsets from the run's start; the driver
stamps the planned time, not the moment it noticed the request.
Gamma inter-arrival gaps with shape k keep the mean at 1/rate and have coefficient of
variation 1/sqrt(k): k = 1 is Poisson, k < 1 is burstier, k -> inf approaches constant rate.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from batchlab.core.config import LengthDist, TrafficConfig
from batchlab.core.request import Request
from batchlab.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TraceItem:
    arrival: float          # seconds after the run's start
    prompt_len: int         # tokens
    output_len: int         # tokens to generate
    prompt: str = ""        # text, when the source has it (ShareGPT, trace file)


def build_trace(cfg: TrafficConfig, rate: float, repeat: int = 0) -> list[TraceItem]:
    """The trace for one sweep point. Same arguments, same trace, on any machine."""
    if cfg.arrival == "trace":
        return read_trace_file(cfg.trace_file)
    seed = np.random.SeedSequence([cfg.seed, repeat])
    arr_rng, len_rng = (np.random.default_rng(s) for s in seed.spawn(2))
    times = arrival_times(cfg, rate, arr_rng)
    prompts, p_text = sample_lengths(cfg.prompt_len, len(times), len_rng, "human")
    outputs, _ = sample_lengths(cfg.output_len, len(times), len_rng, "gpt")
    return [TraceItem(float(t), int(p), int(o), p_text[i] if p_text else "")
            for i, (t, p, o) in enumerate(zip(times, prompts, outputs))]


def arrival_times(cfg: TrafficConfig, rate: float, rng: np.random.Generator) -> np.ndarray:
    horizon = cfg.warmup_s + cfg.duration_s
    step = cfg.rate_step
    times: list[float] = []
    t = 0.0
    while True:
        in_step = step is not None and step.at_s <= t < (step.until_s or np.inf)
        lam = step.to_rate if in_step else rate
        t += _gap(cfg, lam, rng)
        if t >= horizon:
            return np.asarray(times)
        times.append(t)


def _gap(cfg: TrafficConfig, lam: float, rng: np.random.Generator) -> float:
    if cfg.arrival == "poisson":
        return rng.exponential(1.0 / lam)
    if cfg.arrival == "gamma":
        k = cfg.burstiness
        return rng.gamma(k, 1.0 / (lam * k))
    return 1.0 / lam  # constant


def sample_lengths(d: LengthDist, n: int, rng: np.random.Generator, role: str) -> tuple[np.ndarray, list[str]]:
    """n lengths from `d`; for ShareGPT also the texts they came from."""
    if d.dist == "fixed":
        return np.full(n, d.value), []
    if d.dist == "uniform":
        return rng.integers(d.low, d.high + 1, size=n), []
    if d.dist == "lognormal":
        x = np.rint(d.median * np.exp(d.sigma * rng.standard_normal(n)))
        return np.clip(x, d.low, d.high or np.inf).astype(int), []
    turns = _sharegpt_turns(d.path, role)
    idx = rng.integers(0, len(turns), size=n)
    lens = np.array([max(d.low, len(turns[i].split())) for i in idx])
    if d.high:
        lens = np.minimum(lens, d.high)
    return lens, [turns[i] for i in idx]


@lru_cache(maxsize=4)
def _sharegpt_turns(path: str, role: str) -> tuple[str, ...]:
    """First turn of `role` ('human' or 'gpt') in each conversation of a ShareGPT JSON file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"traffic: ShareGPT file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON: {e}") from None
    turns = []
    for conv in data if isinstance(data, list) else []:
        for turn in conv.get("conversations", []) if isinstance(conv, dict) else []:
            if turn.get("from") == role and str(turn.get("value", "")).strip():
                turns.append(str(turn["value"]))
                break
    if not turns:
        raise ConfigError(f"{p}: no '{role}' turns found (expected ShareGPT format: "
                          "[{{\"conversations\": [{{\"from\": \"human\", \"value\": ...}}]}}])")
    return tuple(turns)


def read_trace_file(path: str) -> list[TraceItem]:
    """CSV with columns arrival_time (s), prompt_len, output_len, and optionally prompt."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"traffic.trace_file not found: {p}")
    items = []
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"arrival_time", "prompt_len", "output_len"} - set(reader.fieldnames or [])
        if missing:
            raise ConfigError(f"{p}: missing column(s) {', '.join(sorted(missing))}")
        for line, row in enumerate(reader, start=2):
            try:
                item = TraceItem(float(row["arrival_time"]), int(row["prompt_len"]),
                                 int(row["output_len"]), row.get("prompt") or "")
            except ValueError as e:
                raise ConfigError(f"{p}:{line}: {e}") from None
            if item.arrival < 0 or item.prompt_len <= 0 or item.output_len <= 0:
                raise ConfigError(f"{p}:{line}: times must be >= 0 and lengths > 0")
            items.append(item)
    if not items:
        raise ConfigError(f"{p}: the trace is empty")
    return sorted(items, key=lambda i: i.arrival)


def trace_rate(items: list[TraceItem]) -> float:
    """Mean arrival rate of a replayed trace, used as its sweep point's `rate`."""
    span = items[-1].arrival if len(items) > 1 else 1.0
    return len(items) / span if span > 0 else float(len(items))


def make_requests(trace: list[TraceItem], t0: float, prepare: Callable[[Request], None] | None = None) -> list[Request]:
    """One request per trace item, arriving at t0 + its offset, each passed to `prepare` (the
    backend's). A request `prepare` refuses (ValueError: empty prompt, longer than the model's
    context) is recorded as failed with the reason, as a server would answer it with a 400: it
    stays in the results and never runs."""
    reqs = []
    for i, item in enumerate(trace):
        r = Request(f"r{i:06d}", item.prompt_len, item.output_len, t0 + item.arrival, prompt=item.prompt, index=i)
        if prepare is not None:
            try:
                prepare(r)
            except ValueError as e:
                r.fail(f"invalid request: {e}")
        reqs.append(r)
    return reqs
