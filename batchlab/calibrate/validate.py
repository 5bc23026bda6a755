"""Validate the simulator: the same traces on a real backend and on the simulator calibrated from it.

For each workload (the config's own traffic, `base`, and any held-out ones in `validation.workloads`):
1. the real sweep (OUT/WORKLOAD/real, a results directory like any `batchlab run`, so it resumes);
2. the same sweep again on the same traces (OUT/WORKLOAD/rerun): the machine's noise floor;
3. every real point replayed in virtual time on a `SimulatedBackend` whose step costs come from
   the profile of the path the strategy uses (request-level for naive/dynamic, iteration-level for
   continuous), and twice more with those costs scaled by 1 -+ the fit's RMS error;
4. a burst per strategy (a queue that never empties) on both sides: throughput is judged there,
   where the backend sets it; below capacity the trace sets it and hides any error.
Latency (p50 E2E, p50/p99 TTFT, p50 TPOT) is judged per trace below capacity. The profiles are
fitted on closed bursts, never on these traces, so every cell is held out. calibrate/accuracy.py
turns the cells into errors, the noise floor, 90 % intervals and their coverage:
OUT/validation.csv (every cell), OUT/accuracy.json (per metric), OUT/validation.png.
"""
from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import click
import pandas as pd

from batchlab.backends import make_backend
from batchlab.backends.cost import COEFFS, StepCost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.calibrate import accuracy
from batchlab.core.config import RunConfig, load_config
from batchlab.core.sustain import saturated_tokens
from batchlab.core.traffic import build_trace
from batchlab.errors import ConfigError, RunFailed, user_errors
from batchlab.run.executors import Executor, LocalExecutor, make_executor
from batchlab.run.point import run_point
from batchlab.run.schema import summary_row
from batchlab.run.sweep import run_sweep
from batchlab.schedulers import level_of

KEY = ["strategy", "rate", "repeat"]
TIME_TERMS = ("overhead_s", "weight_s") + COEFFS[1:]       # every step-time coefficient a profile can hold


@dataclass(frozen=True)
class Profile:
    path: str
    cost: StepCost
    sigma: float                 # the fit's relative RMS error: the step-cost uncertainty the intervals carry


@dataclass
class Validation:
    cells: pd.DataFrame          # one row per held-out cell and metric (accuracy.with_errors)
    summary: pd.DataFrame        # one row per metric (accuracy.summary)


def load_profiles(paths: list[str]) -> dict[str, Profile]:
    """level (request | iteration | any) -> the profile."""
    out = {}
    for p in paths:
        cost = StepCost.from_json(p)
        data = json.loads(Path(p).read_text())
        sigma = float(data.get("fit_rms_rel_error") or 0.0)     # a preset has no fit: no model term
        out[data.get("level", "any")] = Profile(p, cost, sigma if math.isfinite(sigma) else 0.0)
    return out


def profile_for(strategy: str, profiles: dict[str, Profile]) -> Profile:
    level = level_of(strategy)
    if level in profiles:
        return profiles[level]
    if "any" in profiles:
        return profiles["any"]
    if len(profiles) == 1:
        return next(iter(profiles.values()))
    raise ConfigError(f"no {level}-level profile for strategy '{strategy}': run "
                      f"`batchlab profile --strategy {strategy} ...` and pass it with --profile")


def sim_cost(cfg: RunConfig, cost: StepCost, scale: float = 1.0) -> StepCost:
    """The profile's timings (every step-time term times `scale`) with the real run's memory
    budget, so memory triggers match."""
    if scale != 1.0:
        cost = replace(cost, **{k: scale * getattr(cost, k) for k in TIME_TERMS})
    if cfg.backend.memory_budget_bytes:
        return replace(cost, kv_budget_bytes=cfg.backend.memory_budget_bytes)
    return cost


# the simulated sides: the calibrated replay, and the same with every step cost 1 -+ sigma
SIDES = {"sim": 0.0, "sim_lo": -1.0, "sim_hi": 1.0}


def simulate_points(cfg: RunConfig, real: pd.DataFrame, profiles: dict[str, Profile],
                    executor: Executor | None = None) -> dict[str, pd.DataFrame]:
    """Replay every real point's trace on the calibrated simulator, once per side (side by side
    on the executor); per side, one summary row per point, in the real summary's order."""
    calls = []
    for side, k in SIDES.items():
        for _, point in real.iterrows():
            prof = profile_for(point["strategy"], profiles)
            calls.append((cfg, point["strategy"], float(point["rate"]), int(point["repeat"]), prof.path,
                          sim_cost(cfg, prof.cost, 1 + k * prof.sigma)))
    rows: list[dict | None] = [None] * len(calls)
    for fin in (executor or LocalExecutor()).map(sim_point, calls):
        if fin.error is not None:
            raise RunFailed(f"validate: a simulated replay was lost: {fin.error}")
        rows[fin.index] = fin.value
    n = len(real)
    return {side: pd.DataFrame(rows[i * n:(i + 1) * n]) for i, side in enumerate(SIDES)}


def sim_point(cfg: RunConfig, strategy: str, rate: float, repeat: int, path: str, cost: StepCost) -> dict:
    """One real point's trace on the simulator with step costs `cost`: its summary row (a pure function)."""
    sim_cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"kind": "sim", "profile": path, "replicas": 1})})
    trace = build_trace(cfg.traffic, rate, repeat)
    res = run_point(sim_cfg, strategy, rate, repeat, SimulatedBackend(cost), trace)
    return summary_row(sim_cfg, strategy, rate, repeat, cost.name, res.summary, {"profile": path, **res.meta})


def burst_trace(cfg: RunConfig, strategy: str):
    """Six full batches of the workload's own requests, arriving at once (at least 64)."""
    rows = {"naive": cfg.naive.batch_size, "dynamic": cfg.dynamic.max_batch_size}.get(strategy, cfg.continuous.max_num_seqs)
    n = max(64, 6 * rows)
    rate = 1.5 * n / cfg.traffic.horizon_s
    return rate, [replace(t, arrival=0.0) for t in build_trace(cfg.traffic, rate, 0)[:n]]


def saturation(cfg: RunConfig, profiles: dict[str, Profile], path: Path, noise: bool, progress=None) -> pd.DataFrame:
    """Per strategy, the steady-middle output tokens/s of a burst: real (twice with `noise`) and
    simulated on every side. Real rows are appended to `path` as they come and a rerun keeps them;
    simulated ones are recomputed (milliseconds), so a new profile never meets an old replay."""
    done = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["strategy", "side", "throughput_tok_s"])
    have = set(zip(done["strategy"], done["side"]))
    rows = [done]
    backend = None
    try:
        for strategy in cfg.strategies:
            rate, trace = burst_trace(cfg, strategy)
            prof = profile_for(strategy, profiles)
            for side in (["real", "real_b"] if noise else ["real"]) + list(SIDES):
                if side in SIDES:
                    b = SimulatedBackend(sim_cost(cfg, prof.cost, 1 + SIDES[side] * prof.sigma))
                elif (strategy, side) in have:
                    continue
                else:
                    backend = b = backend or make_backend(cfg)
                    if progress:
                        progress(f"saturation burst: {strategy}, {len(trace)} requests at once ({side})")
                res = run_point(cfg, strategy, rate, 0, b, trace)
                row = pd.DataFrame([{"strategy": strategy, "side": side, "throughput_tok_s": saturated_tokens(res.requests)}])
                if side not in SIDES:
                    row.to_csv(path, mode="a", header=not path.is_file(), index=False)
                rows.append(row)
    finally:
        if backend is not None:
            asyncio.run(backend.close())
    wide = pd.concat(rows, ignore_index=True).pivot_table(index="strategy", columns="side",
                                                          values="throughput_tok_s", aggfunc="last")
    return wide.reindex(cfg.strategies).reset_index()


def validate(cfg: RunConfig, profile_paths: list[str], out: Path, progress=None) -> Validation:
    profiles = load_profiles(profile_paths)
    for s in cfg.strategies:
        profile_for(s, profiles)                 # fail before the (long) real run, not after
    noise = cfg.validation.noise
    parts = []
    executor = make_executor(cfg.executor)     # NOTE: first, so a Ray started here serves every half
    try:
        for name in ["base", *cfg.validation.workloads]:
            wc = cfg.workload(name)
            say = (lambda m, n=name: progress(f"{n}: {m}")) if progress else None
            real = pd.read_csv(run_sweep(wc, out / name / "real", progress=say) / "summary.csv")
            rerun = pd.read_csv(run_sweep(wc, out / name / "rerun", progress=say) / "summary.csv") if noise else None
            sims = simulate_points(wc, real, profiles, executor)
            lat = accuracy.cells(real, rerun, sims, KEY, accuracy.LATENCY, "latency")
            lat.insert(1, "workload", name)
            parts.append(lat)
            if cfg.validation.saturation:
                wide = saturation(wc, profiles, out / name / "saturation.csv", noise, say)
                sat = accuracy.cells(*_sat_sides(wide), ["strategy"], accuracy.SATURATION, "saturation")
                sat.insert(1, "workload", name)
                parts.append(sat)
    finally:
        executor.close()
    table = accuracy.with_errors(pd.concat(parts, ignore_index=True))
    summ = accuracy.summary(table)
    table.to_csv(out / "validation.csv", index=False)
    meta = {"profiles": {lvl: {"path": p.path, "fit_rms_rel_error": p.sigma} for lvl, p in profiles.items()},
            "workloads": {"base": {}} | cfg.validation.workloads, "noise_runs": 2 if noise else 1,
            "interval": "90 %: sim +- 1.645 sqrt(model^2 + run^2), see batchlab/calibrate/accuracy.py",
            "metrics": summ.to_dict(orient="records")}
    (out / "accuracy.json").write_text(json.dumps(meta, indent=2) + "\n")
    from batchlab.calibrate.validate_plot import plot_validation
    plot_validation(table, summ, out / "validation.png")
    return Validation(table, summ)


def _sat_sides(wide: pd.DataFrame):
    one = lambda col: wide[["strategy", col]].rename(columns={col: "throughput_tok_s"})   # noqa: E731
    rerun = one("real_b") if "real_b" in wide else None
    return one("real"), rerun, {side: one(side) for side in SIDES}


def report_lines(v: Validation) -> list[str]:
    """The per-metric table: error and noise floor (median / P90 of |relative difference|), how
    often the 90 % interval held the real value, and the target."""
    pct = lambda x: f"{100 * x:.1f}%" if x == x else "-"     # noqa: E731
    lines = [f"{'metric':<17}{'cells':>6}{'error med/P90':>18}{'noise med/P90':>18}{'in 90% PI':>11}  target"]
    for _, r in v.summary.iterrows():
        target = f"{r['target']}: {r['met']}" if r["target"] else "(noise floor only)"
        lines.append(f"{r['metric']:<17}{r['cells']:>6}{pct(r['error_median']) + ' / ' + pct(r['error_p90']):>18}"
                     f"{pct(r['noise_median']) + ' / ' + pct(r['noise_p90']):>18}{pct(r['coverage']):>11}  {target}")
    cov = float(v.cells["inside"].mean())
    ok = "within" if accuracy.coverage_ok(cov) else "outside"
    lines.append(f"90% intervals held the real value in {pct(cov)} of {len(v.cells)} cells "
                 f"({ok} the {100 * accuracy.COVERAGE[0]:g}-{100 * accuracy.COVERAGE[1]:g}% an honest interval gives)")
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
    """Run CONFIG (and its held-out workloads) on its real backend twice and on the simulator
    calibrated by PROFILE; report errors, the noise floor and 90 % interval coverage."""
    for p in profiles:
        if not Path(p).is_file():
            raise ConfigError(f"--profile: file not found: {p}")
    cfg = load_config(config, list(overrides) + ([f"executor.kind={executor}"] if executor else []))
    if cfg.backend.kind in ("openai", "hf-cb"):
        raise ConfigError(f"backend.kind '{cfg.backend.kind}' batches for itself; validate 'hf' (or 'sim') backends")
    load_profiles(list(profiles))
    out_dir = Path(out)
    result = validate(cfg, list(profiles), out_dir, progress=lambda m: click.echo(f"  real: {m}"))
    for line in report_lines(result):
        click.echo(line)
    click.echo(f"wrote {out_dir / 'validation.csv'}, {out_dir / 'accuracy.json'}, {out_dir / 'validation.png'}")
