"""`batchlab size`: the cheapest GPUs that hold the SLO at the config's traffic, checked in simulation.

The space is GPU type x tensor-parallel degree x sequence cap x replicas. Per device (a GPU at a
TP degree, or the config's own step model) the closed form (tune/closed_form.py) gives the
largest cap whose full batch keeps the TPOT budget within memory, and the replicas that cap
needs for the traffic's tokens/s; the caps tried are that one, half of it and twice it. Per
(device, cap) a ladder of replica counts then runs in simulation from the closed form's count,
down while the setting holds and up while it does not, until it finds the fewest that hold.
Every round sends each unfinished ladder's next count to the executor together (local or Ray).

A setting holds by the sustain rule (core/sustain.py) over the measured window: the work served
reaches SERVED of the work offered, the TTFT trend shows no growing queue (GROWTH), and every
SLO percentile is within its limit. The traffic is the config's own, a replayed trace included,
built once and sent to every setting unchanged.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from batchlab.backends.cost import StepCost
from batchlab.core.config import RunConfig
from batchlab.core.metrics import measured, summarize
from batchlab.core.sustain import GROWTH, SERVED, served_share, ttft_slope
from batchlab.core.trace_item import TraceItem
from batchlab.errors import ConfigError
from batchlab.run.executors import Executor, LocalExecutor
from batchlab.tune.closed_form import largest_cap, step_model

UNPRICED = 1.0            # $ per GPU-hour when the config states no price: settings rank by GPU count
SHORT = 0.8               # below this share of the offered tokens/s at full batches, a setting is not simulated


@dataclass(frozen=True)
class Device:
    """What one replica runs on: a catalog GPU at a TP degree, or the config's own step model."""
    gpu: str | None                  # None: the config's step model as it is
    tp: int
    usd_per_gpu_hour: float
    cost: StepCost | None            # None: it does not fit (why_not says why)
    why_not: str = ""

    @property
    def label(self) -> str:
        return f"{self.tp}x {self.gpu}" if self.gpu else "as configured"


@dataclass
class Setting:
    device: Device
    cap: int
    replicas: int
    holds: bool = False
    why: tuple[str, ...] = ()        # what fails ("TPOT p95 64 ms > 60 ms", "served 91 %", "memory: ...")
    figures: dict[str, float] = field(default_factory=dict)   # served share, SLO percentiles, tok/s
    simulated: bool = True

    @property
    def gpus(self) -> int:
        return self.replicas * self.device.tp

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.device.usd_per_gpu_hour

    def record(self) -> dict[str, Any]:
        return {"gpu": self.device.gpu, "tp": self.device.tp, "device": self.device.label, "cap": self.cap,
                "replicas": self.replicas, "gpus": self.gpus, "usd_per_hour": self.usd_per_hour,
                "holds": self.holds, "why": list(self.why), "simulated": self.simulated, **self.figures}


@dataclass(frozen=True)
class Traffic:
    """The traffic every setting sees, and what the closed form reads of it."""
    trace: list[TraceItem]
    rate: float                      # the point's nominal rate (the config's highest)
    qps: float                       # measured: requests per second of the trace
    mean_prompt: float
    mean_output: float


def traffic_of(cfg: RunConfig) -> Traffic:
    from batchlab.core.traffic import build_trace
    if cfg.traffic.arrival == "closed":
        raise ConfigError("size: sizes for a rate of arrivals; a closed loop has users, not a rate "
                          "(its throughput is what the hardware gives it)")
    rate = max(cfg.traffic.rates)
    trace = build_trace(cfg.traffic, rate, 0)
    if len(trace) < 2:
        raise ConfigError("size: the traffic has fewer than two requests; lengthen traffic.duration_s or the trace")
    span = trace[-1].arrival - trace[0].arrival
    if cfg.traffic.warmup_s >= trace[-1].arrival:
        raise ConfigError(f"size: traffic.warmup_s ({cfg.traffic.warmup_s:g} s) leaves no request to measure: the "
                          f"last arrives at {trace[-1].arrival:.1f} s")
    qps = (len(trace) - 1) / span if span > 0 else float("inf")
    n = len(trace)
    return Traffic(trace, rate, qps, sum(t.prompt_len for t in trace) / n, sum(t.output_len for t in trace) / n)


# ---------------------------------------------------------------- one setting, simulated
def simulate_setting(cfg: RunConfig, strategy: str, knob: str, traffic: Traffic, device: Device, cap: int,
                     replicas: int, slos: dict[str, float]) -> Setting:
    """One setting on the traffic: the config with this device, cap and replica count."""
    from batchlab.backends.simulated import SimulatedBackend
    from batchlab.run.point import run_point
    run_cfg = setting_config(cfg, knob, device, cap, replicas)
    res = run_point(run_cfg, strategy, traffic.rate, 0, SimulatedBackend(device.cost), trace=traffic.trace)
    lo = cfg.traffic.warmup_s
    hi = max(r.arrival_time for r in res.requests) + 1e-9
    kept = measured(res.requests, lo)
    s = summarize(kept)
    share, slope = served_share(res.requests, lo, hi), ttft_slope(res.requests, lo)
    why = [f"{k.split('_')[0].upper()} {k.split('_')[1]} {_fmt(s[k])} > {_fmt(v)}"
           for k, v in slos.items() if not s.get(k, math.nan) <= v]
    if not share >= SERVED:
        why.append(f"served {100 * share:.1f} % of the offered tokens")
    if slope > GROWTH:
        why.append(f"queue growing ({slope:.2f} s of TTFT per s)")
    if s["failed"]:
        why.append(f"{s['failed']} failed")
    figures = {"served_share": share, "ttft_slope": slope, "throughput_tok_s": s["throughput_tok_s"]}
    figures |= {k: s[k] for k in ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99", "e2e_p99")}
    figures |= {k: s[k] for k in slos}
    return Setting(device, cap, replicas, not why, tuple(why), figures)


def setting_config(cfg: RunConfig, knob: str, device: Device, cap: int, replicas: int) -> RunConfig:
    section, key = knob.split(".")
    backend = {"replicas": replicas} | ({"gpu": device.gpu, "tp": device.tp} if device.gpu else {})
    return cfg.model_copy(update={
        "backend": cfg.backend.model_copy(update=backend),
        section: getattr(cfg, section).model_copy(update={key: cap}),
    })


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


# ---------------------------------------------------------------- the search
def devices(cfg: RunConfig, gpus: list[str] | None, tps: list[int]) -> list[Device]:
    """Every (GPU, TP) to try: the catalog's (or `gpus`) when the config names a model shape,
    else the config's own step model alone. One that cannot hold the weights is kept, unsimulated."""
    from batchlab.backends.gpus import CATALOG, gpu
    from batchlab.backends.model_shape import load_shape
    from batchlab.backends.roofline import roofline
    b = cfg.backend
    if b.shape is None:
        price = b.usd_per_gpu_hour if b.usd_per_gpu_hour is not None else UNPRICED
        return [Device(None, 1, price, b.cost())]
    shape = load_shape(b.shape, b.dtype)
    out = []
    for entry in [gpu(g) for g in gpus] if gpus else list(CATALOG.values()):
        price = entry.usd_per_hour if b.usd_per_gpu_hour is None else b.usd_per_gpu_hour
        for tp in tps:
            try:
                out.append(Device(entry.name, tp, price, roofline(shape, entry, tp)))
            except ConfigError as e:      # the weights do not fit, or the GPU has no FP8
                kind = "memory" if "do not fit" in str(e) else "dtype"
                out.append(Device(entry.name, tp, price, None, f"{kind}: {e}"))
    return out


@dataclass
class Ladder:
    """One (device, cap): replica counts tried, until the fewest that hold is bracketed."""
    device: Device
    cap: int
    start: int
    max_replicas: int
    runs: dict[int, Setting] = field(default_factory=dict)

    @property
    def replica_usd(self) -> float:
        return self.device.usd_per_gpu_hour * self.device.tp

    def next(self, best: float = math.inf) -> int | None:
        """The next count to simulate, or None when the fewest that hold is known, none does, or
        every count left costs more than `best` (the cheapest setting found to hold)."""
        afford = self.max_replicas if best == math.inf else int(best // self.replica_usd + 1e-9)
        held = [n for n, s in self.runs.items() if s.holds]
        failed = [n for n, s in self.runs.items() if not s.holds]
        if not self.runs:
            n = min(self.start, afford)
        elif held:
            n = min(held) - 1
            if n in failed:
                return None
        else:
            n = max(failed) + 1
            if n > min(self.max_replicas, afford):
                return None
        return n if n >= 1 else None

    @property
    def fewest(self) -> int | None:
        held = [n for n, s in self.runs.items() if s.holds]
        return min(held) if held else None


def candidate_caps(device: Device, traffic: Traffic, slos: dict[str, float], max_cap: int) -> tuple[list[int], int, str]:
    """The closed form's cap (largest full batch under the TPOT budget and memory), half and twice it."""
    cap, why = largest_cap(device.cost, traffic.mean_prompt, traffic.mean_output, slos, max_cap)
    return sorted({max(1, cap // 2), cap, min(max_cap, 2 * cap)}), cap, why


def full_batch_tok_s(device: Device, traffic: Traffic, cap: int) -> float:
    """Output tokens/s one replica serves with `cap` mean-length sequences always running: the
    most it serves at this cap (its step time grows with the batch)."""
    fixed, per_seq = step_model(device.cost, traffic.mean_prompt, traffic.mean_output)
    return cap / (fixed + cap * per_seq)


def replicas_needed(device: Device, traffic: Traffic, cap: int) -> int:
    """The closed form's count: the traffic's output tokens/s over what one replica serves at a full batch."""
    return max(1, math.ceil(traffic.qps * traffic.mean_output / full_batch_tok_s(device, traffic, cap)))


def too_few(device: Device, cap: int, replicas: int, traffic: Traffic) -> Setting | None:
    """A setting the closed form already rules out, unsimulated: even with every replica's batch
    full (the most a replica serves at this cap, its step time growing with the batch) it serves
    less than SHORT of the offered tokens/s. NOTE: such settings build queues that grow for the
    whole trace, the slowest kind to simulate, and they can only fail."""
    most = replicas * full_batch_tok_s(device, traffic, cap)
    offered = traffic.qps * traffic.mean_output
    if most >= SHORT * offered:
        return None
    return Setting(device, cap, replicas, False,
                   (f"served at most {100 * most / offered:.0f} % of the offered tokens by the closed form "
                    f"({most:,.0f} of {offered:,.0f} tok/s)",), {"throughput_tok_s": most}, simulated=False)


@dataclass
class SizeResult:
    strategy: str
    knob: str
    slos: dict[str, float]
    traffic: Traffic
    settings: list[Setting]
    closed_caps: dict[str, tuple[int, str]]      # device label -> (closed-form cap, what limits it)
    priced: bool
    skipped: list[tuple[str, int]] = field(default_factory=list)   # (device, cap) never run: even one replica costs more than the pick
    space: int = 0                   # settings the search covers: devices that fit x caps x replica counts, and those that do not
    max_replicas: int = 0

    @cached_property
    def ranked(self) -> list[Setting]:
        """Cheapest first; at equal cost, holding settings first, then the larger cap."""
        return sorted(self.settings, key=lambda s: (s.usd_per_hour, not s.holds, -s.cap, s.device.label))

    @cached_property
    def pick(self) -> Setting | None:
        held = [s for s in self.ranked if s.holds]
        if not held:
            return None
        cheapest = [s for s in held if s.usd_per_hour == held[0].usd_per_hour]
        # NOTE: among equally cheap settings, one whose full batch keeps the TPOT budget by the
        # closed form is safe under any burst; prefer it, then the largest cap (the most headroom)
        safe = [s for s in cheapest if s.cap <= self.closed_caps[s.device.label][0]]
        return max(safe or cheapest, key=lambda s: s.cap)

    def closest_miss(self) -> Setting | None:
        """Of the simulated settings cheaper than the pick, the one that came closest to holding:
        the most of the offered tokens served, then the fewest SLO limits missed."""
        pick = self.pick
        near = [s for s in self.settings if s.simulated and not s.holds and pick and s.usd_per_hour < pick.usd_per_hour]
        return max(near, key=lambda s: (min(1.0, s.figures.get("served_share", 0.0)), -len(s.why)), default=None)

    def cheaper_failing(self) -> list[Setting]:
        """The settings cheaper than the pick that fail, most expensive first; at equal cost the
        simulated ones, then the one that came closest (most of the offered tokens served)."""
        pick = self.pick
        if pick is None:
            return []
        return sorted([s for s in self.settings if s.cap and not s.holds and s.usd_per_hour < pick.usd_per_hour],
                      key=lambda s: (-s.usd_per_hour, not s.simulated, -s.figures.get("served_share", 0.0)))


def next_probes(ladders: list[Ladder], width: int, exhaustive: bool = False) -> list[tuple[Ladder, int]]:
    """The next round: each ladder's next count, cheapest first, as many as the executor runs at
    once. NOTE: branch and bound: a count costing more than the cheapest setting found to hold
    cannot be the pick, nor can any larger count of its ladder, so it is not run, and a ladder
    whose closed-form count costs more starts at the most it can afford (unless `exhaustive`,
    which finds every ladder's fewest, for the full cost-latency picture)."""
    held = [lad.replica_usd * n for lad in ladders for n, s in lad.runs.items() if s.holds]
    best = math.inf if exhaustive else min(held, default=math.inf)
    pending = [(lad.replica_usd * n, lad, n) for lad in ladders if (n := lad.next(best)) is not None]
    pending.sort(key=lambda p: (p[0], p[1].device.label, p[1].cap))
    return [(lad, n) for _, lad, n in (pending if exhaustive else pending[:width])]


def size(cfg: RunConfig, strategy: str, knob: str, slos: dict[str, float], devs: list[Device],
         max_replicas: int = 64, max_cap: int = 1024, executor: Executor | None = None,
         exhaustive: bool = False, progress: Callable[[str], None] = lambda line: None) -> SizeResult:
    """Every device's ladders, run round by round on the executor (next_probes); the result holds
    every setting simulated, and those that could not hold the weights."""
    executor = executor or LocalExecutor()
    traffic = traffic_of(cfg)
    settings: list[Setting] = []
    ladders: list[Ladder] = []
    closed: dict[str, tuple[int, str]] = {}
    for d in devs:
        if d.cost is None:
            settings.append(Setting(d, 0, 1, False, (d.why_not,), simulated=False))
            continue
        caps, cap, why = candidate_caps(d, traffic, slos, max_cap)
        closed[d.label] = (cap, why)
        ladders += [Ladder(d, c, min(max_replicas, replicas_needed(d, traffic, c)), max_replicas) for c in caps]
    priced = cfg.backend.shape is not None or cfg.backend.usd_per_gpu_hour is not None
    width = max(1, executor.parallelism)
    while todo := next_probes(ladders, width, exhaustive):
        for lad, n in todo:
            if (short := too_few(lad.device, lad.cap, n, traffic)) is not None:
                lad.runs[n] = short
        todo = [(lad, n) for lad, n in todo if n not in lad.runs]
        calls = [(cfg, strategy, knob, traffic, lad.device, lad.cap, n, slos) for lad, n in todo]
        for fin in executor.map(simulate_setting, calls) if calls else []:
            if fin.error is not None:
                raise RuntimeError(f"size: a simulated setting was lost: {fin.error}")
            lad, n = todo[fin.index]
            lad.runs[n] = fin.value
        if calls:
            runs = [s for lad in ladders for s in lad.runs.values()]
            held = [s.usd_per_hour for s in runs if s.holds]
            progress(f"  {len(runs)} settings judged, {sum(s.simulated for s in runs)} simulated; cheapest holding so far: "
                     + ("none" if not held else f"${min(held):,.2f}/h" if priced else f"{min(held):g} GPUs"))
    settings += [s for lad in ladders for s in lad.runs.values()]
    skipped = [(lad.device.label, lad.cap) for lad in ladders if not lad.runs]
    space = len(ladders) * max_replicas + sum(d.cost is None for d in devs)
    return SizeResult(strategy, knob, slos, traffic, settings, closed, priced, skipped, space, max_replicas)
