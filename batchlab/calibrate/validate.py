"""Validate the simulator: the same traces on a real backend and on the simulator calibrated from it.

The real sweep runs first (written to OUT/real like any `batchlab run`, so it resumes); then every
point is replayed in virtual time on a `SimulatedBackend` whose step costs come from the profile
of the path that strategy uses (request-level for naive/dynamic, iteration-level for continuous).
Traces depend only on the traffic settings, so both sides see identical requests. The result is
the relative error (sim - real) / real of p50/p99 TTFT, p50 TPOT and throughput per strategy and
rate (medians over the config's repeats on each side), in OUT/validation.csv.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click
import pandas as pd

from batchlab.backends.cost import StepCost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.core.config import RunConfig, load_config
from batchlab.core.traffic import build_trace
from batchlab.errors import ConfigError, RunFailed, user_errors
from batchlab.run.executors import Executor, LocalExecutor, make_executor
from batchlab.run.point import run_point
from batchlab.run.schema import summary_row
from batchlab.run.sweep import run_sweep
from batchlab.schedulers import level_of

METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "throughput_tok_s")
HEADLINE = ("ttft_p50", "tpot_p50", "throughput_tok_s")     # the 10 % target


def load_profiles(paths: list[str]) -> dict[str, tuple[str, StepCost]]:
    """level (request | iteration | any) -> (path, cost)."""
    out = {}
    for p in paths:
        cost = StepCost.from_json(p)
        level = json.loads(Path(p).read_text()).get("level", "any")
        out[level] = (p, cost)
    return out


def profile_for(strategy: str, profiles: dict[str, tuple[str, StepCost]]) -> tuple[str, StepCost]:
    level = level_of(strategy)
    if level in profiles:
        return profiles[level]
    if "any" in profiles:
        return profiles["any"]
    if len(profiles) == 1:
        return next(iter(profiles.values()))
    raise ConfigError(f"no {level}-level profile for strategy '{strategy}': run "
                      f"`batchlab profile --strategy {strategy} ...` and pass it with --profile")


def sim_cost(cfg: RunConfig, cost: StepCost) -> StepCost:
    """The profile's timings with the real run's memory budget, so memory triggers match."""
    if cfg.backend.memory_budget_bytes:
        return replace(cost, kv_budget_bytes=cfg.backend.memory_budget_bytes)
    return cost


def simulate_points(cfg: RunConfig, real: pd.DataFrame, profiles, executor: Executor | None = None) -> pd.DataFrame:
    """Replay every real point's trace on the calibrated simulator (side by side on the
    executor); one summary row per point, in the real summary's order."""
    calls = []
    for _, point in real.iterrows():
        strategy = point["strategy"]
        path, cost = profile_for(strategy, profiles)
        calls.append((cfg, strategy, float(point["rate"]), int(point["repeat"]), path, cost))
    rows: list[dict | None] = [None] * len(calls)
    for fin in (executor or LocalExecutor()).map(sim_point, calls):
        if fin.error is not None:
            raise RunFailed(f"validate: a simulated replay was lost: {fin.error}")
        rows[fin.index] = fin.value
    return pd.DataFrame(rows)


def sim_point(cfg: RunConfig, strategy: str, rate: float, repeat: int, path: str, cost: StepCost) -> dict:
    """One real point's trace on the simulator calibrated by `cost`: its summary row (a pure function)."""
    sim_cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"kind": "sim", "profile": path, "replicas": 1})})
    trace = build_trace(cfg.traffic, rate, repeat)
    res = run_point(sim_cfg, strategy, rate, repeat, SimulatedBackend(sim_cost(cfg, cost)), trace)
    return summary_row(sim_cfg, strategy, rate, repeat, cost.name, res.summary, {"profile": path, **res.meta})


def compare(real: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and rate: medians over repeats on each side, then (sim - real) / real."""
    key = ["strategy", "rate"]
    med = [df.groupby(key, sort=False)[list(METRICS)].median().reset_index() for df in (real, sim)]
    both = med[0].merge(med[1], on=key, suffixes=("_real", "_sim"))
    both["repeats"] = real.groupby(key, sort=False).size().values
    for m in METRICS:
        both[f"{m}_err"] = (both[f"{m}_sim"] - both[f"{m}_real"]) / both[f"{m}_real"]
    return both


def validate(cfg: RunConfig, profile_paths: list[str], out: Path, progress=None) -> pd.DataFrame:
    profiles = load_profiles(profile_paths)
    for s in cfg.strategies:
        profile_for(s, profiles)                 # fail before the (long) real run, not after
    executor = make_executor(cfg.executor)     # NOTE: first, so a Ray started here serves both halves
    try:
        real_dir = run_sweep(cfg, out / "real", progress=progress)
        real = pd.read_csv(real_dir / "summary.csv")
        sim = simulate_points(cfg, real, profiles, executor)
    finally:
        executor.close()
    sim.to_csv(out / "sim_summary.csv", index=False)
    table = compare(real, sim)
    table.to_csv(out / "validation.csv", index=False)
    return table


def report_lines(table: pd.DataFrame) -> list[str]:
    lines = [f"{'strategy':<11}{'rate':>6}  " + "  ".join(f"{m + ' real/sim/err':>34}" for m in METRICS)]
    for _, r in table.iterrows():
        cells = []
        for m in METRICS:
            scale, unit = (1.0, "tok/s") if m.startswith("throughput") else (1e3, "ms")
            cells.append(f"{scale * r[m + '_real']:>9.1f} /{scale * r[m + '_sim']:>9.1f} {unit:<5}"
                         f"{100 * r[m + '_err']:>+7.1f}%")
        lines.append(f"{r['strategy']:<11}{r['rate']:>6g}  " + "  ".join(f"{c:>34}" for c in cells))
    worst = table[[f"{m}_err" for m in HEADLINE]].abs().max()
    lines.append("max |error|: " + ", ".join(f"{m} {100 * worst[m + '_err']:.1f}%" for m in HEADLINE)
                 + f" (target: within 10%); ttft_p99 {100 * table['ttft_p99_err'].abs().max():.1f}%")
    return lines


@click.command("validate")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--profile", "profiles", multiple=True, required=True,
              help="Profile JSON from `batchlab profile` (one per path: --strategy dynamic and continuous).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--out", default="results/validate", show_default=True, help="Output directory.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where points run (default: the config's executor.kind): ray runs real and simulated points as Ray tasks.")
@user_errors
def validate_cmd(config, profiles, overrides, out, executor):
    """Run CONFIG on its real backend and on the simulator calibrated by PROFILE; report the errors."""
    for p in profiles:
        if not Path(p).is_file():
            raise ConfigError(f"--profile: file not found: {p}")
    cfg = load_config(config, list(overrides) + ([f"executor.kind={executor}"] if executor else []))
    if cfg.backend.kind in ("openai", "hf-cb"):
        raise ConfigError(f"backend.kind '{cfg.backend.kind}' batches for itself; validate 'hf' (or 'sim') backends")
    out_dir = Path(out)
    table = validate(cfg, list(profiles), out_dir, progress=lambda m: click.echo(f"  real: {m}"))
    for line in report_lines(table):
        click.echo(line)
    click.echo(f"wrote {out_dir / 'validation.csv'}")
