"""Tune to a latency budget: the largest batch that keeps the SLO, then replicas for the traffic.

The seed's recipe as a command. Closed form first: with b sequences running, one decode step
costs t(b) = fixed + b x per-sequence cost (a profile's coefficients at the traffic's mean
lengths), so the largest cap under a TPOT budget is the largest b with t(b) <= budget, one
replica then sustains b / t(b) tokens/s, and the traffic needs ceil(qps x output / that) replicas.
Then the simulator checks it: every cap on a grid at saturation (throughput and p95 TPOT, with
the SLO line, plotted), and the chosen cap at the target traffic with N replicas behind a router,
stepping N until every SLO holds and the replicas keep up.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import numpy as np

from batchlab.backends.presets import StepCost, load_cost
from batchlab.core.config import ConfigError, LengthDist, RunConfig

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


# ---------------------------------------------------------------- inputs
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


# ---------------------------------------------------------------- closed form
@dataclass(frozen=True)
class ClosedForm:
    fixed_ms: float                  # per step, whatever the batch
    per_seq_ms: float                # per running sequence, at the traffic's mean lengths
    budget_ms: float | None          # the TPOT-like budget the cap is sized for
    cap: int                         # largest batch whose step fits the budget (and memory)
    limited_by: str                  # "slo", "memory", "max_cap", or "infeasible"
    step_ms: float                   # t(cap)
    tok_s_per_replica: float         # cap / t(cap)
    need_tok_s: float                # qps x mean output
    replicas: int

    def step(self, b: float) -> float:
        return self.fixed_ms + b * self.per_seq_ms


def step_model(cost: StepCost, p: float, o: float) -> tuple[float, float]:
    """(fixed, per-sequence) seconds of a mean decode step: each running sequence reads its KV at
    the mean context p + o/2, and pays its prompt's prefill (and, at worst, a prefill pass of its
    own) once over o steps."""
    fixed = cost.overhead_s + cost.weight_s
    per_seq = (cost.decode_s_per_row + cost.kv_s_per_token * (p + o / 2)
               + (cost.prefill_s_per_token * p + cost.prefill_step_s) / o)
    return fixed, per_seq


def closed_form(cost: StepCost, target: Target) -> ClosedForm:
    p, o = mean_length(target.prompt_len), mean_length(target.output_len)
    fixed, per_seq = (1e3 * x for x in step_model(cost, p, o))
    budgets = [v * 1e3 for k, v in target.slos.items() if k.split("_")[0] in BATCH_BOUND]
    budget = min(budgets) if budgets else None
    mem_cap = max(1, int(cost.kv_budget_bytes // (cost.kv_bytes_per_token * (p + o))))
    cap, why = max_batch_under(lambda b: fixed + b * per_seq, budget, min(mem_cap, target.max_cap))
    if why == "limit":
        why = "memory" if mem_cap <= target.max_cap else "max_cap"
    step = fixed + cap * per_seq
    thru = cap / (step / 1e3)
    need = target.qps * o
    replicas = max(1, -(-int(need) // int(thru))) if thru >= 1 else math.ceil(need / thru)  # the seed's arithmetic
    return ClosedForm(fixed, per_seq, budget, cap, why, step, thru, need, replicas)


def max_batch_under(step_ms, budget_ms: float | None, limit: int) -> tuple[int, str]:
    """The seed's max_batch_under: grow b while t(b + 1) fits the budget."""
    if budget_ms is not None and step_ms(1) > budget_ms:
        return 1, "infeasible"
    if budget_ms is None:
        return limit, "limit"
    b = 1
    while b < limit and step_ms(b + 1) <= budget_ms:
        b += 1
    return b, "slo" if b < limit else "limit"


# ---------------------------------------------------------------- simulation checks
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
    return RunConfig.model_validate(tree)


def simulate(cost: StepCost, target: Target, cap: int, replicas: int, rate: float,
             slos: dict[str, float], max_wait_ms: float = 0.0) -> SimPoint:
    from batchlab.backends.simulated import SimulatedBackend
    from batchlab.bench.runner import run_point
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
    batch_slos = {k: v for k, v in target.slos.items() if k.split("_")[0] in BATCH_BOUND}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        rate = min(target.qps, 1.25 * mid / (cf.step(mid) / 1e3) / mean_length(target.output_len))
        if all(simulate(cost, target, mid, 1, rate, batch_slos).slo_ok.values()):
            lo = mid
        else:
            hi = mid
    return lo, "largest cap whose simulated SLO holds"


def replicas_for(cf: ClosedForm, cap: int) -> int:
    thru = cap / (cf.step(cap) / 1e3)
    return max(1, -(-int(cf.need_tok_s) // max(1, int(thru))))


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


def tune(cost: StepCost, target: Target) -> TuneResult:
    """Closed form, saturated sweep over caps, choice, then the replica check at the target traffic."""
    cf = closed_form(cost, target)
    sweep = sweep_caps(cost, target, cf, cap_grid(cf, cf.cap if cf.limited_by == "memory" else target.max_cap))
    cap, why = pick_cap(cost, target, cf, sweep)
    runs, n = check_replicas(cost, target, cap, replicas_for(cf, cap))
    closed_check = next((p for p in runs if p.cap == cf.cap and p.replicas == cf.replicas), None)
    if closed_check is None:
        closed_check = simulate(cost, target, cf.cap, cf.replicas, target.qps, target.slos,
                                default_max_wait_ms(cf.cap, target, cf.replicas))
    wait = default_max_wait_ms(cap, target, n or cf.replicas) if target.strategy == "dynamic" else None
    return TuneResult(cost, target, cf, sweep, cap, why, closed_check, runs, n, wait)


# ---------------------------------------------------------------- report and plot
def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def _slo_text(slos: dict[str, float]) -> str:
    return ", ".join(f"{k} <= {_ms(v)}" for k, v in slos.items()) or "none"


def _point_text(p: SimPoint, slos: dict[str, float]) -> str:
    got = ", ".join(f"{k} {_ms(p.summary[k])}" + (" ok" if p.slo_ok.get(k) else " BREACH") for k in slos)
    return (f"{p.replicas} replica(s): {got}; served {100 * p.served_ratio:.0f}% of offered tokens"
            f" -> {'holds' if p.holds else 'fails'}")


def report_lines(res: TuneResult) -> list[str]:
    cf, t = res.closed, res.target
    knob = KNOB[t.strategy]
    lines = [
        f"model: {res.cost.description or res.cost.name}; decode step t(b) = {cf.fixed_ms:.2f} + {cf.per_seq_ms:.3f} b ms "
        f"at mean prompt {mean_length(t.prompt_len):.0f}, output {mean_length(t.output_len):.0f} tokens",
        f"SLO: {_slo_text(t.slos)}; traffic {t.qps:g} req/s",
        "closed form (the seed's arithmetic):",
        f"  budget {cf.budget_ms:g} ms/token -> max batch {cf.cap} (step {cf.step_ms:.1f} ms; limited by {cf.limited_by})"
        if cf.budget_ms is not None else f"  no TPOT budget -> batch {cf.cap} (limited by {cf.limited_by})",
        f"  one replica: {cf.cap} / {cf.step_ms:.1f} ms = {cf.tok_s_per_replica:.0f} tok/s; need {t.qps:g} x "
        f"{mean_length(t.output_len):.0f} = {cf.need_tok_s:.0f} tok/s -> {cf.replicas} replicas",
        f"simulated, closed-form setting ({knob}={cf.cap}, {cf.replicas} replicas, {t.router}, {t.duration_s:g} s of "
        f"Poisson traffic): " + _point_text(res.closed_check, t.slos),
        f"simulated search (1 replica, saturated, caps {res.sweep[0].cap}..{res.sweep[-1].cap}): {knob}={res.cap} "
        f"({res.cap_reason})",
    ]
    lines += [f"  at {knob}={res.cap}: " + _point_text(p, t.slos) for p in res.replica_runs]
    if res.replicas is None:
        last = res.replica_runs[-1]
        breached = [k for k, ok in last.slo_ok.items() if not ok] or ["keeping up"]
        hint = ("a request-level batch holds new arrivals until it finishes: try --strategy continuous"
                if t.strategy != "continuous" and any(k.split("_")[0] in ("ttft", "queue_wait", "e2e") for k in breached)
                else "shrink the batch or relax the SLO")
        lines.append(f"verdict: no replica count up to {last.replicas} holds {', '.join(breached)} at "
                     f"{knob}={res.cap}; {hint}")
    else:
        extra = f", dynamic.max_wait_ms={res.max_wait_ms:g}" if res.max_wait_ms is not None else ""
        lines.append(f"verdict: {knob}={res.cap}{extra} with {res.replicas} replicas holds {_slo_text(t.slos)} at "
                     f"{t.qps:g} req/s (closed form said {cf.cap} with {cf.replicas})")
    return lines


def to_json(res: TuneResult) -> dict[str, Any]:
    def point(p: SimPoint) -> dict:
        keep = ("throughput_tok_s", "requests_per_s", "tpot_p50", "tpot_p95", "ttft_p50", "ttft_p99",
                "queue_wait_p99", "finished", "failed")
        return {"cap": p.cap, "replicas": p.replicas, "rate": p.rate, "served_ratio": p.served_ratio,
                "served_tok_s": p.served_tok_s,
                "slo_ok": p.slo_ok, "holds": p.holds, **{k: p.summary.get(k) for k in keep}}
    return {"cost": asdict(res.cost), "target": {**asdict(res.target), "prompt_len": res.target.prompt_len.model_dump(),
                                                 "output_len": res.target.output_len.model_dump()},
            "closed_form": asdict(res.closed), "closed_form_check": point(res.closed_check),
            "sweep": [point(p) for p in res.sweep], "cap": res.cap, "cap_reason": res.cap_reason,
            "replica_runs": [point(p) for p in res.replica_runs], "replicas": res.replicas,
            "max_wait_ms": res.max_wait_ms}


def plot(res: TuneResult, path: Path) -> Path:
    """Throughput and p95 TPOT of one saturated replica against the batch cap, SLO line included."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cf, t = res.closed, res.target
    caps = np.array([p.cap for p in res.sweep])
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(caps, [p.served_tok_s for p in res.sweep], "o-", color="tab:blue", label="throughput, simulated")
    ax.plot(caps, caps / (cf.step(caps) / 1e3), "--", color="tab:blue", alpha=0.5, label="throughput, closed form b/t(b)")
    ax.set_xlabel(f"batch cap ({KNOB[t.strategy]}, sequences)")
    ax.set_ylabel("throughput per replica (output tokens/s)")
    ax2 = ax.twinx()
    ax2.plot(caps, [1e3 * p.summary["tpot_p95"] for p in res.sweep], "s-", color="tab:red", label="p95 TPOT, simulated")
    ax2.plot(caps, cf.step(caps), "--", color="tab:red", alpha=0.5, label="step time, closed form t(b)")
    for k, v in t.slos.items():
        if k.split("_")[0] in BATCH_BOUND:
            ax2.axhline(v * 1e3, color="black", linestyle=":", label=f"SLO {k} = {v * 1e3:g} ms")
    ax2.axvline(res.cap, color="gray", linestyle="-.", label=f"chosen cap = {res.cap}")
    ax2.set_ylabel("time per output token (ms)")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    ax.set_title(f"Batch cap vs throughput and p95 TPOT: {t.strategy}, one replica at saturation\n"
                 f"{res.cost.description or res.cost.name}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- command
@click.command("tune")
@click.option("--slo", "slos", multiple=True, required=True, metavar="METRIC=LIMIT",
              help="Latency SLO, e.g. tpot_p95=50ms or ttft_p99=2s (repeatable).")
@click.option("--qps", type=float, required=True, help="Target traffic at peak, requests/s.")
@click.option("--output-len", default="128", show_default=True, help="Output tokens: 200 or '{dist: uniform, low: 50, high: 300}'.")
@click.option("--prompt-len", default="128", show_default=True, help="Prompt tokens, same forms as --output-len.")
@click.option("--profile", type=str, default=None, help="Measured profile JSON (batchlab profile).")
@click.option("--preset", type=str, default=None, help="A simulator preset, e.g. llama2-7b-a100.")
@click.option("--step-ms", type=float, default=None, help="Linear model: fixed step time, ms.")
@click.option("--per-seq-ms", type=float, default=None, help="Linear model: extra ms per running sequence.")
@click.option("--strategy", type=click.Choice(list(KNOB)), default="continuous", show_default=True)
@click.option("--router", type=click.Choice(["round_robin", "least_outstanding"]), default="least_outstanding", show_default=True)
@click.option("--duration", type=float, default=60.0, show_default=True, help="Simulated seconds of traffic per check.")
@click.option("--max-cap", type=int, default=1024, show_default=True, help="Largest batch cap to consider.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", default="results/tune", show_default=True, help="Directory for tune.json and tune.png.")
def tune_cmd(slos, qps, output_len, prompt_len, profile, preset, step_ms, per_seq_ms, strategy, router,
             duration, max_cap, seed, out) -> None:
    """Largest batch cap that keeps the SLO, and the replicas the traffic needs (checked in simulation)."""
    from batchlab.cli import user_errors
    user_errors(_tune_main)(slos, qps, output_len, prompt_len, profile, preset, step_ms, per_seq_ms, strategy,
                            router, duration, max_cap, seed, out)


def _tune_main(slos, qps, output_len, prompt_len, profile, preset, step_ms, per_seq_ms, strategy, router,
               duration, max_cap, seed, out) -> None:
    for flag, value in (("--qps", qps), ("--duration", duration), ("--max-cap", max_cap)):
        if not value > 0:
            raise ConfigError(f"{flag} must be > 0 (got {value:g})")
    target = Target(qps, parse_length(prompt_len, "--prompt-len"), parse_length(output_len, "--output-len"),
                    dict(parse_slo(s) for s in slos), strategy, router, duration, min(10.0, duration / 4), seed, max_cap)
    cost = choose_cost(profile, preset, step_ms, per_seq_ms)
    res = tune(cost, target)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tune.json").write_text(json.dumps(to_json(res), indent=2, default=str))
    png = plot(res, out_dir / "tune.png")
    for line in report_lines(res):
        click.echo(line)
    click.echo(f"wrote {out_dir / 'tune.json'}, {png}")
