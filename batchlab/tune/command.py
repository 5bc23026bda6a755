"""`batchlab tune CONFIG [--set ...]`: read the traffic, SLO and step-time model from a run config,
run the search (tune/search.py), print and save what it found. The output directory is checked
before any work, so a bad --out never costs a search."""
from __future__ import annotations

import json
from pathlib import Path

import click

from batchlab.core.files import write_atomic
from batchlab.errors import user_errors
from batchlab.run.config import load_user_config
from batchlab.run.executors import make_executor
from batchlab.run.results import check_location
from batchlab.tune.plot import plot
from batchlab.tune.report import report_lines, to_json
from batchlab.tune.search import tune
from batchlab.tune.target import target_of


@click.command("tune")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. --set traffic.rates=[40] (repeatable).")
@click.option("--slo", "slos", multiple=True, metavar="METRIC=LIMIT",
              help="A percentile SLO instead of the config's slo section, e.g. tpot_p95=50ms or ttft_p99=2s (repeatable).")
@click.option("--strategy", default=None, help="The strategy to size (default: continuous if the config lists it, else its first).")
@click.option("--max-cap", type=int, default=1024, show_default=True, help="Largest batch cap to consider.")
@click.option("--out", default="results/tune", show_default=True, help="Directory for tune.json and tune.png.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where the simulated checks run (the config's executor.kind): ray runs them as Ray tasks.")
@user_errors
def tune_cmd(config, overrides, slos, strategy, max_cap, out, executor) -> None:
    """Largest batch cap that keeps the SLO at the config's highest rate, and the replicas that
    traffic needs (checked in simulation on the config's simulator backend)."""
    cfg = load_user_config(config, list(overrides) + ([f"executor.kind={executor}"] if executor else []))
    target, cost = target_of(cfg, tuple(slos), strategy, max_cap)
    out_dir = Path(out)
    check_location(out_dir)
    runner = make_executor(cfg.executor)     # connects before anything is written
    try:
        res = tune(cost, target, runner)
    finally:
        runner.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "tune.json", json.dumps(to_json(res), indent=2, default=str))
    png = plot(res, out_dir / "tune.png")
    for line in report_lines(res):
        click.echo(line)
    click.echo(f"wrote {out_dir / 'tune.json'}, {png}")
