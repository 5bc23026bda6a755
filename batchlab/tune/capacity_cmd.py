"""`batchlab capacity`: parse the flags, run the search (tune/capacity.py), print and save what it found.

A command of its own rather than a `tune` flag: `tune` sizes a batch cap and replicas from a
step-time model and percentile SLOs given as flags, while this search takes a whole run config
(its traffic, strategies, knobs and `slo` section, as `batchlab run` does) and answers the report's
capacity question finer than a sweep's rate grid.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_user_config
from batchlab.run.executors import make_executor
from batchlab.run.experiment import config_tree
from batchlab.run.results import check_location
from batchlab.tune.capacity import check_plan, search, summary_lines


@click.command("capacity")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--strategy", "strategies", multiple=True, help="Search only these of the config's strategies (repeatable).")
@click.option("--low", type=float, default=None, help="Lowest rate of the opening round (default: the config's lowest rate).")
@click.option("--high", type=float, default=None, help="Highest rate of the opening round (default: the config's highest rate).")
@click.option("--tolerance", type=float, default=0.02, show_default=True,
              help="Stop when the failing rate is within this fraction above the sustained one.")
@click.option("--probes", type=int, default=None,
              help="Rates probed per strategy per round (default: what the executor runs side by side; 1 is bisection).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where probes run (default: the config's executor.kind): ray runs each as a Ray task.")
@click.option("--out", default="results/capacity", show_default=True, help="Directory for capacity.json.")
@user_errors
def capacity_cmd(config, overrides, strategies, low, high, tolerance, probes, executor, out) -> None:
    """Highest rate each strategy sustains under the config's SLO (simulated, by bisection)."""
    cfg = load_user_config(config, list(overrides) + ([f"executor.kind={executor}"] if executor else []))
    if cfg.traffic.arrival == "closed":
        raise ConfigError("capacity: searches arrival rates; a closed loop has users, not a rate "
                          "(`batchlab run` sweeps its traffic.concurrency)")
    rates = sorted(cfg.traffic.rates)
    plan = check_plan(cfg, list(strategies), low or rates[0], high or rates[-1], tolerance, probes or 1)
    out_dir = Path(out)
    check_location(out_dir)                     # before the search: a bad --out costs nothing
    runner = make_executor(cfg.executor)        # connects (or starts Ray) before anything is written
    where = runner.where()                      # NOTE: while connected: after close() Ray is gone
    try:
        if probes is None:
            width = max(1, runner.parallelism // (len(plan.strategies) * cfg.traffic.repeats))
            plan = check_plan(cfg, plan.strategies, plan.low, plan.high, tolerance, width)
        unit = "sessions/s" if cfg.traffic.sessions else "req/s"
        found = search(plan, runner, on_round=lambda r, fs: click.echo(
            f"round {r}: " + "; ".join(f"{f.strategy} {_bracket(f, unit)}" for f in fs), err=True))
    finally:
        runner.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"config": config_tree(cfg), "low": plan.low, "high": plan.high, "tolerance": tolerance, "probes_per_round": plan.width,
              "executor": where, "rule": "core/sustain.py",
              "strategies": {f.strategy: {"sustains": f.lo, "fails_at": f.hi, "saturated_req_s": f.saturated_req_s,
                                          "probes": [asdict(p) for p in f.probes]}
                             for f in found}}
    write_atomic(out_dir / "capacity.json", json.dumps(record, indent=2) + "\n")
    for line in summary_lines(found, plan, unit):
        click.echo(line)
    click.echo(f"wrote {out_dir / 'capacity.json'} (probes ran on {where})")


def _bracket(f, unit: str) -> str:
    lo, hi = f.lo, f.hi
    return f"[{'none' if lo is None else f'{lo:g}'}, {'-' if hi is None else f'{hi:g}'}) {unit}"
