"""Tune to a latency budget: the largest batch that keeps the SLO, then replicas for the traffic.

The seed's recipe as a command, in four files: tune_target (the traffic, SLOs and step-time model),
tune_math (the closed form: t(b) = fixed + b x per-sequence, the largest b under the TPOT budget and
the replicas for qps x output tokens/s), tune_sim (the simulator checks the cap on a grid at
saturation, then the replica count at the target traffic), tune_report and tune_plot (what it says).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click

from batchlab.backends.presets import StepCost
from batchlab.tune.closed_form import ClosedForm, closed_form, max_batch_under, replicas_for, step_model
from batchlab.tune.plot import plot
from batchlab.tune.report import report_lines, to_json
from batchlab.tune.simulate import (SimPoint, bisect_cap, cap_grid, check_replicas, default_max_wait_ms, pick_cap,
                                     served, settled, sim_config, simulate, sweep_caps)
from batchlab.tune.target import (BATCH_BOUND, KNOB, SLO_KEY, UNITS, Target, choose_cost, linear_cost,
                                        mean_length, parse_length, parse_slo)
from batchlab.core.config import ConfigError

# NOTE: the moved names stay importable from here, where tests and callers have always found them.
__all__ = ["BATCH_BOUND", "KNOB", "SLO_KEY", "UNITS", "ClosedForm", "SimPoint", "Target", "TuneResult",
           "bisect_cap", "cap_grid", "check_replicas", "choose_cost", "closed_form", "default_max_wait_ms",
           "linear_cost", "max_batch_under", "mean_length", "parse_length", "parse_slo", "pick_cap", "plot",
           "replicas_for", "report_lines", "served", "settled", "sim_config", "simulate", "step_model",
           "sweep_caps", "to_json", "tune", "tune_cmd"]


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
