"""`batchlab tune`: parse the flags, run the search (tune/search.py), print and save what it found."""
from __future__ import annotations

import json
from pathlib import Path

import click

from batchlab.core.config import ExecutorConfig
from batchlab.errors import ConfigError, user_errors
from batchlab.run.executors import make_executor
from batchlab.tune.plot import plot
from batchlab.tune.report import report_lines, to_json
from batchlab.tune.search import tune
from batchlab.tune.target import KNOB, Target, choose_cost, parse_length, parse_slo


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
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where the simulated checks run: ray runs them as Ray tasks ($RAY_ADDRESS, else a Ray started here).")
def tune_cmd(slos, qps, output_len, prompt_len, profile, preset, step_ms, per_seq_ms, strategy, router,
             duration, max_cap, seed, out, executor) -> None:
    """Largest batch cap that keeps the SLO, and the replicas the traffic needs (checked in simulation)."""
    user_errors(_tune_main)(slos, qps, output_len, prompt_len, profile, preset, step_ms, per_seq_ms, strategy,
                            router, duration, max_cap, seed, out, executor)


def _tune_main(slos, qps, output_len, prompt_len, profile, preset, step_ms, per_seq_ms, strategy, router,
               duration, max_cap, seed, out, executor) -> None:
    for flag, value in (("--qps", qps), ("--duration", duration), ("--max-cap", max_cap)):
        if not value > 0:
            raise ConfigError(f"{flag} must be > 0 (got {value:g})")
    target = Target(qps, parse_length(prompt_len, "--prompt-len"), parse_length(output_len, "--output-len"),
                    dict(parse_slo(s) for s in slos), strategy, router, duration, min(10.0, duration / 4), seed, max_cap)
    cost = choose_cost(profile, preset, step_ms, per_seq_ms)
    runner = make_executor(ExecutorConfig(kind=executor))     # connects before anything is written
    try:
        res = tune(cost, target, runner)
    finally:
        runner.close()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tune.json").write_text(json.dumps(to_json(res), indent=2, default=str))
    png = plot(res, out_dir / "tune.png")
    for line in report_lines(res):
        click.echo(line)
    click.echo(f"wrote {out_dir / 'tune.json'}, {png}")
