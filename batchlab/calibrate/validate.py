"""Validate the simulator: the same traces on a real backend and on the simulator calibrated from it.

For each workload (the config's own traffic, `base`, and any held-out ones in `validation.workloads`):
1. the real sweep (OUT/WORKLOAD/real, a results directory like any `batchlab run`, so it resumes);
2. the same sweep again on the same traces (OUT/WORKLOAD/rerun): the machine's noise floor;
3. every real point replayed in virtual time on a `SimulatedBackend` whose step costs come from
   the profile of the path the strategy uses (request-level for naive/dynamic, iteration-level for
   continuous) or, for a server (backend.kind openai), on its twin (`--twin`: the twin config
   `batchlab profile` wrote, its scheduler and limits); twice more with costs scaled by 1 -+ the
   fit's RMS error; every replay's step costs times the live factor measured on the *other*
   workloads' real runs (calibrate/live.py, `validation.live`), so no workload is judged on
   itself; the machine's speed around the runs (a reference burst, `validation.drift`, against
   the profile's replay of it) scales the replays too where it passes the gate, or is recorded
   only with `validation.drift: measure`;
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
import os
import secrets
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import click
import numpy as np
import pandas as pd
import yaml

from batchlab.backends import TARGET, make_backend
from batchlab.backends.cost import StepCost
from batchlab.backends.simulated import SimOptions, SimulatedBackend
from batchlab.calibrate import accuracy, live
from batchlab.calibrate.live import NO_DELAY, Delay, Live
from batchlab.calibrate.live import NONE as LIVE_NONE
from batchlab.core.clock import RealClock, VirtualClock
from batchlab.core.config import RunConfig
from batchlab.core.files import write_atomic
from batchlab.core.sustain import saturated_tokens
from batchlab.core.trace_item import TraceItem
from batchlab.core.traffic import build_trace, burst_trace
from batchlab.errors import ConfigError, RunFailed, user_errors
from batchlab.run.config import load_config, target_strategies
from batchlab.run.executors import Executor, LocalExecutor, make_executor
from batchlab.run.point import run_point
from batchlab.run.schema import summary_row
from batchlab.run.sweep import points, run_sweep
from batchlab.schedulers import scheduler_class

KEY = ["strategy", "rate", "repeat"]
SERVER = "server"                # the level of a strategy a load target batches for itself


def level_of(strategy: str) -> str:
    """request or iteration (a scheduler), or SERVER (a load target's own batching)."""
    return SERVER if strategy in target_strategies() else scheduler_class(strategy).level


@dataclass(frozen=True)
class Profile:
    path: str
    cost: StepCost
    sigma: float                 # the fit's relative RMS error: the step-cost uncertainty the intervals carry
    twin: RunConfig | None = None   # a server's twin config (its scheduler and limits); None: the run's own strategy
    reference_s: float | None = None  # the drift probe timed on the server when it was profiled (None: not timed)

    def predicted_reference_s(self, level: str) -> float:
        """The drift probe's burst as this profile predicts it: replayed on its steps (and a
        server's on its twin's scheduler)."""
        return burst_seconds(SimulatedBackend(self.cost), level, prof=self)

    def replay_as(self, cfg: RunConfig, strategy: str) -> tuple[RunConfig, str]:
        """The config and strategy a point of `cfg` is replayed with in simulation: the real
        config on the simulator, or the server's twin with the point's traffic and SLO."""
        if self.twin is None:
            return cfg.model_copy(update={"backend": SimOptions(profile=self.path)}), strategy
        return self.twin.model_copy(update={"traffic": cfg.traffic, "slo": cfg.slo}), self.twin.strategies[0]


@dataclass
class Validation:
    cells: pd.DataFrame          # one row per held-out cell and metric (accuracy.with_errors)
    summary: pd.DataFrame        # one row per metric (accuracy.summary)


def load_profiles(paths: list[str], twin: str | None = None) -> dict[str, Profile]:
    """level (request | iteration | any | SERVER) -> the profile; a twin config gives a server's."""
    out = {}
    for p in paths:
        out[json.loads(Path(p).read_text()).get("level", "any")] = _profile(p)
    if twin is not None:
        tc = load_config(twin)
        if not isinstance(tc.backend, SimOptions) or tc.backend.profile is None:
            raise ConfigError(f"--twin {twin}: not a twin config (a simulator with backend.profile, as `batchlab profile` writes)")
        out[SERVER] = replace(_profile(tc.backend.profile), twin=tc)
    return out


def _profile(path: str) -> Profile:
    cost = StepCost.from_json(path)
    record = json.loads(Path(path).read_text())
    sigma = float(record.get("fit_rms_rel_error") or 0.0)   # a preset has no fit
    return Profile(path, cost, sigma if math.isfinite(sigma) else 0.0, reference_s=record.get("reference_burst_s"))


def profile_for(strategy: str, profiles: dict[str, Profile]) -> Profile:
    level = level_of(strategy)
    if level in profiles:
        return profiles[level]
    if level == SERVER:
        raise ConfigError(f"strategy '{strategy}' is the server's own: give its twin with --twin (the config "
                          "`batchlab profile` writes beside the profile)")
    if "any" in profiles:
        return profiles["any"]
    if len(profiles) == 1:
        return next(iter(profiles.values()))
    raise ConfigError(f"no {level}-level profile for strategy '{strategy}': run "
                      f"`batchlab profile --strategy {strategy} ...` and pass it with --profile")


def sim_cost(cfg: RunConfig, cost: StepCost, scale: float = 1.0, first: float = 1.0, delay: float = 0.0) -> StepCost:
    """The profile's timings (every step-time term times `scale`, the first-token terms times
    `first` besides, each request's time before the scheduler moved by `delay` seconds) with the real
    run's memory budget, so memory triggers match; a negative `delay` shortens the front end)."""
    if (scale, first) != (1.0, 1.0):
        cost = cost.scaled(scale, first)
    if delay:
        cost = cost.first_token_moved(delay)
    budget = cfg.backend.model_dump().get("memory_budget_bytes")     # the real kind's key, if it has one
    return replace(cost, kv_budget_bytes=budget) if budget else cost


# the simulated sides: the calibrated replay, and the same with every step cost 1 -+ sigma
SIDES = {"sim": 0.0, "sim_lo": -1.0, "sim_hi": 1.0}
MEDIAN_SE = math.sqrt(math.pi / 2)   # a median of n values strays sqrt(pi / 2) / sqrt(n) of their spread (normal)
# validation.interval -> how accuracy.json says its intervals were built (benchmarks compare records by it)
INTERVAL = {"step-cost": "90 %: sim +- 1.645 sqrt(model^2 + run^2), see batchlab/calibrate/accuracy.py; model: step "
                         "costs moved by the fit's error, the live factor's standard error and the drift factor's "
                         "(its median's standard error)",
            "held-out": "90 %: real in [sim / (1 + q), sim / (1 - q)], q = t(0.95, n) rms(error over the n cells of "
                        "the other workloads, same metric), see batchlab/calibrate/accuracy.py"}


def simulate_points(cfg: RunConfig, real: pd.DataFrame, profiles: dict[str, Profile],
                    executor: Executor | None = None, drift: dict[str, Drift] | None = None,
                    sides: dict[str, float] = SIDES) -> dict[str, pd.DataFrame]:
    """Replay every real point's trace on the calibrated simulator, once per side (side by side
    on the executor); per side, one summary row per point, in the real summary's order.
    `drift`: level -> the machine's speed now over the profile's (step costs are multiplied by it)."""
    calls = []
    for side, k in sides.items():
        for _, point in real.iterrows():
            prof = profile_for(point["strategy"], profiles)
            d = (drift or {}).get(level_of(point["strategy"]), NO_DRIFT)
            calls.append((cfg, point["strategy"], float(point["rate"]), int(point["repeat"]), prof,
                          sim_cost(cfg, prof.cost, *d.side(prof, k))))
    rows: list[dict | None] = [None] * len(calls)
    for fin in (executor or LocalExecutor()).map(sim_point, calls):
        if fin.error is not None:
            raise RunFailed(f"validate: a simulated replay was lost: {fin.error}")
        rows[fin.index] = fin.value
    n = len(real)
    return {side: pd.DataFrame(rows[i * n:(i + 1) * n]) for i, side in enumerate(sides)}


def sim_point(cfg: RunConfig, strategy: str, rate: float, repeat: int, prof: Profile, cost: StepCost) -> dict:
    """One real point's trace on the simulator with step costs `cost`: its summary row, under the
    real point's strategy name (a pure function)."""
    sim_cfg, runs_as = prof.replay_as(cfg, strategy)
    trace = build_trace(cfg.traffic, rate, repeat)
    res = run_point(sim_cfg, runs_as, rate, repeat, SimulatedBackend(cost), trace)
    row = summary_row(sim_cfg, runs_as, rate, repeat, cost.name, res.summary, {"profile": prof.path, **res.meta})
    return row | {"strategy": strategy}


def whole_rows(path: Path, columns: list[str]) -> pd.DataFrame:
    """The rows a kept CSV holds whole. NOTE: a kill or a full disk in the middle of an append
    leaves a last line without its newline; it is cut off here, before the file is read or appended
    to, so the rerun measures that row again rather than gluing the next one onto it."""
    if not path.is_file():
        return pd.DataFrame(columns=columns)
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
    if path.stat().st_size == 0:
        path.unlink()                      # only a torn header: start again
        return pd.DataFrame(columns=columns)
    return pd.read_csv(path)


def saturation_burst(cfg: RunConfig, strategy: str):
    """Six full batches of the workload's own requests, arriving at once (at least 64): (rate, trace)."""
    rows = 32 if level_of(strategy) == SERVER else scheduler_class(strategy).batch_rows(cfg)   # a server's: unknown
    return burst_trace(cfg.traffic, max(64, 6 * rows))


def saturation_real(cfg: RunConfig, path: Path, noise: bool, real: "LentBackend", progress=None) -> None:
    """Per strategy, the real bursts (twice with `noise`) not yet in `path`: each row is appended
    as it comes, so a killed validation keeps the bursts it finished."""
    done = whole_rows(path, ["strategy", "side", "throughput_tok_s"])
    have = set(zip(done["strategy"], done["side"]))
    for strategy in cfg.strategies:
        rate, trace = saturation_burst(cfg, strategy)
        for side in ["real", "real_b"] if noise else ["real"]:
            if (strategy, side) in have:
                continue
            if progress:
                progress(f"saturation burst: {strategy}, {len(trace)} requests at once ({side})")
            res = run_point(cfg, strategy, rate, 0, real.get(), trace)
            row = pd.DataFrame([{"strategy": strategy, "side": side, "throughput_tok_s": saturated_tokens(res.requests)}])
            row.to_csv(path, mode="a", header=not path.is_file(), index=False)


def saturation(cfg: RunConfig, profiles: dict[str, Profile], path: Path, drift: dict[str, Drift]) -> pd.DataFrame:
    """Per strategy, the steady-middle output tokens/s of a burst: the real ones kept in `path`
    (`saturation_real`) beside the simulated ones on every side, recomputed (milliseconds), so a
    new profile never meets an old replay."""
    rows = [whole_rows(path, ["strategy", "side", "throughput_tok_s"])]
    for strategy in cfg.strategies:
        rate, trace = saturation_burst(cfg, strategy)
        prof = profile_for(strategy, profiles)
        d = drift.get(level_of(strategy), NO_DRIFT)
        run_cfg, runs_as = prof.replay_as(cfg, strategy)
        for side, k in SIDES.items():
            b = SimulatedBackend(sim_cost(cfg, prof.cost, *d.side(prof, k)))
            res = run_point(run_cfg, runs_as, rate, 0, b, trace)
            rows.append(pd.DataFrame([{"strategy": strategy, "side": side,
                                       "throughput_tok_s": saturated_tokens(res.requests)}]))
    wide = pd.concat(rows, ignore_index=True).pivot_table(index="strategy", columns="side",
                                                          values="throughput_tok_s", aggfunc="last")
    return wide.reindex(cfg.strategies).reset_index()


class LentBackend:
    """The workload's real backend, made on first use and shared by its sweeps, reference bursts and
    saturation bursts (one model load), closed by the caller."""

    def __init__(self, cfg: RunConfig):
        self.cfg, self.backend = cfg, None

    def get(self):
        if self.backend is None:
            self.backend = make_backend(self.cfg)
        return self.backend

    def close(self) -> None:
        if self.backend is not None:
            asyncio.run(self.backend.close())


# The drift probe: a fixed closed burst (rows, prompt tokens, new tokens), timed on the real backend
# before the first run, between the runs and after them, and on the simulator once.
REFERENCE = (8, 48, 24)
REFERENCE_REPEATS = 3


def burst_seconds(backend, level: str, cfg: RunConfig | None = None, prof: Profile | None = None) -> float:
    """Median over REFERENCE_REPEATS of the reference burst's duration (prefill to last token). A
    server's (SERVER level) is sent through the client like any trace (under the workload's `cfg`);
    its twin's is replayed under the twin config (`prof`)."""
    if level == SERVER:
        return _server_burst_seconds(backend, cfg, prof)
    from batchlab.calibrate.profile import burst, time_burst
    clock = VirtualClock() if backend.virtual_time else RealClock()

    async def timed():
        await backend.start(clock)
        runs = []
        for i in range(REFERENCE_REPEATS):
            reqs = burst(*REFERENCE, clock.now(), 990_000 + i)
            runs.append(float(sum(await time_burst(backend, level, reqs, clock))))
        return sorted(runs)[len(runs) // 2]
    return clock.run(timed())


def _server_burst_seconds(backend, cfg: RunConfig | None, prof: Profile | None) -> float:
    rows, prompt, new = REFERENCE
    runs, nonce = [], secrets.randbits(48)
    for i in range(REFERENCE_REPEATS):    # NOTE: new prompts each time: a prefix cache must not shorten them
        trace = [TraceItem(0.0, prompt, new, content=((("reference", nonce, i, j), prompt),)) for j in range(rows)]
        run_cfg, strategy = (prof.twin, prof.twin.strategies[0]) if prof is not None else (cfg, cfg.strategies[0])
        res = run_point(run_cfg, strategy, 1.0, 0, backend, trace)
        runs.append(max(r.token_times[-1] for r in res.requests) - min(r.arrival_time for r in res.requests))
    return sorted(runs)[len(runs) // 2]


def reference(path: Path, when: str, levels: list[str], real: LentBackend, progress=None) -> None:
    """Time the reference burst on the real backend for each level, once per `when` (kept in
    `path`, so a resumed validation does not time it again)."""
    done = whole_rows(path, ["when", "level", "seconds"])
    have = set(zip(done["when"], done["level"]))
    for level in levels:
        if (when, level) in have:
            continue
        if progress:
            progress(f"reference burst {REFERENCE[0]} x {REFERENCE[1]} + {REFERENCE[2]} tokens ({level}-level, {when})")
        # NOTE: the 1-minute load average beside each timing: on a shared machine other processes are
        # the main source of drift, so it is kept with the data rather than guessed afterwards
        row = pd.DataFrame([{"when": when, "level": level, "seconds": burst_seconds(real.get(), level, real.cfg),
                             "load_1min": os.getloadavg()[0]}])
        row.to_csv(path, mode="a", header=not path.is_file(), index=False)


@dataclass(frozen=True)
class Drift:
    """The machine's speed now against the profile's: the reference burst's median real duration
    over the profile's prediction of it (> 1: slower today), and the relative spread of the real
    timings (before, between, after), which the intervals carry beside the fit's error."""
    factor: float = 1.0
    spread: float = 0.0
    against: str = "prediction"   # what the factor divides by: the profile's prediction of the probe, or the probe
                                  # as timed when the server was profiled ("profile time": free of the fit's error)
    live: Live = LIVE_NONE        # live traffic's step time over closed bursts', from the other workloads (calibrate/live.py)
    first: Live = LIVE_NONE       # the first-token terms' factor left after that, from the other workloads' p50 TTFT
    delay: Delay = NO_DELAY       # or, validation.first_token: delay, the same miss as seconds a request
    timings: int = 1              # how many reference bursts the factor is the median of
    vs_prediction: float | None = None   # against profile time, the same timings over the prediction, recorded beside:
                                         # where the two part, the profile's one timing stood apart from its own fit

    @property
    def scale(self) -> float:
        """What the replays multiply every step cost by: the machine's speed, then live traffic's."""
        return self.factor * self.live.factor

    @property
    def se(self) -> float:
        """The drift factor's relative standard error. It is a median of `timings` bursts, so this
        is that median's standard error, not one burst's spread: how far one run strays from the
        machine's speed is already the interval's run term (the rerun noise), and counting it here
        too made the intervals hold more than 90 % of the cells."""
        return self.spread * MEDIAN_SE / math.sqrt(self.timings)

    def sigma(self, prof: Profile) -> float:
        """The step costs' relative uncertainty: the fit's error, the drift factor's and the live factor's."""
        return math.hypot(prof.sigma, self.se, self.live.se)

    def gated(self, gate: float) -> Drift:
        """This drift with its own factor set to 1 where it lies within `gate` of its standard
        errors of 1 (the machine's speed not told apart from the profile's); its spread kept, so
        the intervals still carry it (live.distinct: gate 0, or no spread, keeps the factor)."""
        if gate <= 0 or self.se <= 0 or abs(math.log(self.factor)) > gate * self.se:
            return self
        return replace(self, factor=1.0)

    def side(self, prof: Profile, k: float) -> tuple[float, float, float]:
        """(every step cost's factor, the first-token terms' factor besides, the first-token delay)
        for an interval side k (0: the replay, -1 / +1: its bounds): each moved by k times its own
        uncertainty."""
        return (self.scale * (1 + k * self.sigma(prof)), self.first.factor * (1 + k * self.first.se),
                self.delay.seconds + k * self.delay.se)


NO_DRIFT = Drift()

# validation.first_token's two forms: the Drift field each sets, its estimator over the cells' values, its none
FIRST_FORMS = {"factor": ("first", live.estimate, LIVE_NONE), "delay": ("delay", live.estimate_delay, NO_DELAY)}


def drift_factors(path: Path, profiles: dict[str, Profile], strategies: list[str], *,
                  against: str) -> dict[str, Drift]:
    """level -> its Drift, from the reference bursts in `path`, against the burst as the profile
    timed it (`against="profile"`, where it did) or as the profile predicts it (validation.drift_against)."""
    times = pd.read_csv(path).groupby("level")["seconds"]
    out = {}
    for s in strategies:
        level = level_of(s)
        real = times.get_group(level).to_numpy(dtype=float)
        med = float(np.median(real))
        spread = float(np.std(real, ddof=1) / med) if len(real) > 1 else 0.0
        prof = profile_for(s, profiles)
        predicted = prof.predicted_reference_s(level)
        if prof.reference_s and against == "profile":     # NOTE: against a prediction, the fit's error at this one shape would read as drift
            out[level] = Drift(med / prof.reference_s, spread, "profile time", timings=len(real),
                               vs_prediction=med / predicted)
        else:
            out[level] = Drift(med / predicted, spread, timings=len(real))
    return out


def validate(cfg: RunConfig, profile_paths: list[str], out: Path, progress=None, twin: str | None = None) -> Validation:
    profiles = load_profiles(profile_paths, twin)
    for s in cfg.strategies:
        profile_for(s, profiles)                 # fail before the (long) real run, not after
    names = ["base", *cfg.validation.workloads]
    executor = make_executor(cfg.executor)     # NOTE: first, so a Ray started here serves every half
    try:
        measured = measure_workloads(cfg, names, profiles, out, progress)
        fixes = corrections(cfg, measured, profiles, executor)
        parts = [c for name in names for c in judge_workload(cfg, name, measured[name], fixes.drifts[name], profiles,
                                                             out / name, executor)]
    finally:
        executor.close()
    table = accuracy.with_errors(pd.concat(parts, ignore_index=True), rule=interval_rule(cfg))
    summ = accuracy.summary(table, twin=twin is not None)
    record = accuracy_record(cfg, profiles, table, summ, {name: m.drift for name, m in measured.items()}, out)
    record["live"] = live_record({level_of(s): profile_for(s, profiles) for s in cfg.strategies}, fixes.ratios,
                                 fixes.lives, out, (fixes.firsts, fixes.first), cfg.validation.first_token,
                                 cfg.validation.gate, cfg.validation.se_units, drift=pooled_drift(fixes.drifts))
    record["twin"] = twin
    write_atomic(out / "validation.csv", table.to_csv(index=False))
    write_atomic(out / "accuracy.json", json.dumps(record, indent=2) + "\n")
    write_atomic(out / "validate.yaml", config_text(cfg))
    from batchlab.calibrate.validate_plot import plot_validation
    plot_validation(table, summ, out / "validation.png")
    return Validation(table, summ)


@dataclass
class Corrections:
    """What `validate` measured to correct the replays by, per workload and level: `drifts`, the
    Drift each workload's replays run at (every correction folded in, gated), and the live and
    first-token corrections as estimated (`lives`, `first`: before the gate) with the per-cell
    values they came from (`ratios`, `firsts`)."""
    drifts: dict[str, dict[str, Drift]]
    ratios: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    lives: dict[str, dict[str, Live]] = field(default_factory=dict)
    firsts: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    first: dict[str, dict[str, Live | Delay]] = field(default_factory=dict)


def corrections(cfg: RunConfig, measured: dict[str, Measured], profiles: dict[str, Profile],
                executor: Executor) -> Corrections:
    """The drift probe's factor, then the live factor (validation.live), then the first-token
    correction (validation.first_token), each measured with the ones before it applied, and each
    applied only where it is more than validation.gate standard errors from none."""
    gate, form, units = cfg.validation.gate, cfg.validation.first_token, cfg.validation.se_units
    applied = cfg.validation.drift_applied      # `measure` times the probe for the record only
    base = {name: {lvl: d.gated(gate) for lvl, d in m.drift.items()} if applied else {} for name, m in measured.items()}
    out = Corrections({name: dict(d) for name, d in base.items()})
    for _ in range(live.LIVE_PASSES if cfg.validation.live else 0):
        out.ratios = live_ratios(cfg, measured, out.drifts, profiles, executor)
        out.lives = live.leave_one_out(out.ratios, units=units)
        out.drifts = {name: with_live(d, out.lives.get(name, {})) for name, d in base.items()}
    # NOTE: gated after the passes, not between them: the second pass steps from the first's
    # estimate, and a factor set back to none there would be measured again from scratch
    base = {name: with_live(d, live.gated_all(out.lives, gate).get(name, {})) for name, d in base.items()}
    out.drifts = base
    if form == "off":
        return out
    which, est, _ = FIRST_FORMS[form]
    for _ in range(live.FIRST_PASSES):
        out.firsts = first_token_logs(cfg, measured, out.drifts, profiles, executor, form)
        out.first = live.leave_one_out(out.firsts, est, units)
        out.drifts = {name: with_live(d, out.first.get(name, {}), which) for name, d in base.items()}
    out.drifts = {name: with_live(d, live.gated_all(out.first, gate).get(name, {}), which) for name, d in base.items()}
    return out


@dataclass
class Measured:
    """One workload's real side: its sweep, the rerun (None without `validation.noise`) and the
    machine's speed around them."""
    real: pd.DataFrame
    rerun: pd.DataFrame | None
    drift: dict[str, Drift]


def measure_workloads(cfg: RunConfig, names: list[str], profiles: dict[str, Profile], out: Path,
                      progress=None) -> dict[str, Measured]:
    """Every workload's real side, in `validation.order` (each kept under out/NAME as it comes).
    mirrored: every workload's reference burst and real runs in turn, then the rest (rerun, the
    later reference bursts, saturation) in the reverse order, so a machine drifting over the
    validation moves each workload's pair of runs alike rather than landing on the last one."""
    def say(name: str):
        return (lambda m: progress(f"{name}: {m}")) if progress else None
    order = names
    if cfg.validation.order == "mirrored":
        for name in names:
            lent = LentBackend(cfg.workload(name))
            try:
                first_run(cfg, name, out / name, lent, say(name))
            finally:
                lent.close()
        order = names[::-1]
    measured = {name: measure_workload(cfg, name, profiles, out / name, say(name)) for name in order}
    return {name: measured[name] for name in names}


def first_run(cfg: RunConfig, name: str, where: Path, real_backend: LentBackend, say=None) -> pd.DataFrame:
    """A workload's reference burst before its runs (with `validation.drift`) and its real runs;
    what is kept in `where` already is not run again."""
    wc = cfg.workload(name)
    if cfg.validation.drift_timed:
        where.mkdir(parents=True, exist_ok=True)
        reference(where / "reference.csv", "before", sorted({level_of(s) for s in cfg.strategies}), real_backend, say)
    return _sweep(wc, where / "real", real_backend, say)


def measure_workload(cfg: RunConfig, name: str, profiles: dict[str, Profile], where: Path, say=None) -> Measured:
    """One workload's real runs (and rerun), the reference bursts around them and its saturation
    bursts; each kept in `where` as it comes, so a killed validation resumes where it stopped."""
    wc = cfg.workload(name)
    noise, drift_on = cfg.validation.noise, cfg.validation.drift_timed
    levels = sorted({level_of(s) for s in cfg.strategies})
    real_backend, ref = LentBackend(wc), where / "reference.csv"
    try:
        real = first_run(cfg, name, where, real_backend, say)
        rerun = None
        if noise:
            if drift_on:
                reference(ref, "between", levels, real_backend, say)
            rerun = _sweep(wc, where / "rerun", real_backend, say)
        if drift_on:
            reference(ref, "after", levels, real_backend, say)
        if cfg.validation.saturation:
            where.mkdir(parents=True, exist_ok=True)
            saturation_real(wc, where / "saturation.csv", noise, real_backend, say)
        return Measured(real, rerun, drift_factors(ref, profiles, cfg.strategies, against=cfg.validation.drift_against)
                        if drift_on else {})
    finally:
        real_backend.close()


def live_ratios(cfg: RunConfig, measured: dict[str, Measured], drifts: dict[str, dict[str, Drift]],
                profiles: dict[str, Profile], executor: Executor) -> dict[str, dict[str, list[float]]]:
    """workload -> level -> each real run's cell's log live factor (calibrate/live.py): its p50
    TPOT against replays at the workload's drift and live factor so far (none on the first
    pass) and at live.LIVE_PROBE x that."""
    return cell_corrections(cfg, measured, drifts, profiles, executor, live.METRIC,
                            lambda x: replace(x, live=Live(x.live.factor * live.LIVE_PROBE)),
                            lambda d, cell: math.log(d.live.factor) + live.log_correction(*cell, probe=live.LIVE_PROBE))


def first_token_logs(cfg: RunConfig, measured: dict[str, Measured], drifts: dict[str, dict[str, Drift]],
                     profiles: dict[str, Profile], executor: Executor, form: str = "factor") -> dict[str, dict[str, list[float]]]:
    """workload -> level -> each real run's cell's first-token correction: its p50 TTFT against
    replays at the workload's drift and live factor, with the correction so far (1x or no delay on
    the first pass) and one probe step beyond it; as a log factor on the first-token terms
    (live.log_correction, probe PROBE x) or, `form="delay"`, seconds a request
    (live.first_token_delay, probe DELAY_PROBE_S more)."""
    if form == "delay":
        return cell_corrections(cfg, measured, drifts, profiles, executor, live.FIRST_METRIC,
                                lambda x: replace(x, delay=replace(x.delay, seconds=x.delay.seconds + live.DELAY_PROBE_S)),
                                lambda d, cell: d.delay.seconds + live.first_token_delay(*cell))
    return cell_corrections(cfg, measured, drifts, profiles, executor, live.FIRST_METRIC,
                            lambda x: replace(x, first=Live(x.first.factor * live.PROBE)),
                            lambda d, cell: math.log(d.first.factor) + live.log_correction(*cell))


def cell_corrections(cfg: RunConfig, measured: dict[str, Measured], drifts: dict[str, dict[str, Drift]],
                     profiles: dict[str, Profile], executor: Executor, metric: str,
                     probe: Callable[[Drift], Drift], value: Callable[[Drift, tuple[float, float, float]], float]
                     ) -> dict[str, dict[str, list[float]]]:
    """workload -> level -> `value(drift, (real, replayed, replayed at the probe))` of `metric`
    for every real run's cell (first and rerun): the replays at the workload's drift and at
    `probe(drift)`, the correction's one trial step beyond it."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, m in measured.items():
        wc, d = cfg.workload(name), {lvl: drifts[name].get(lvl, NO_DRIFT) for lvl in map(level_of, cfg.strategies)}
        at = {k: simulate_points(wc, m.real, profiles, executor, dd, sides={"sim": 0.0})["sim"][KEY + [metric]]
              for k, dd in (("one", d), ("probe", {lvl: probe(x) for lvl, x in d.items()}))}
        sims = at["one"].merge(at["probe"], on=KEY, suffixes=("_one", "_probe"))
        per = out.setdefault(name, {})
        for run in [m.real] + ([m.rerun] if m.rerun is not None else []):
            for _, row in run[KEY + [metric]].merge(sims, on=KEY).iterrows():
                lvl = level_of(row["strategy"])
                per.setdefault(lvl, []).append(value(d[lvl], (float(row[metric]), float(row[f"{metric}_one"]),
                                                              float(row[f"{metric}_probe"]))))
    return out


def with_live(drift: dict[str, Drift], lives: dict[str, Live], which: str = "live") -> dict[str, Drift]:
    """The workload's drift per level with its live (or, `which="first"`, first-token) factor folded
    in (levels without drift get one)."""
    out = dict(drift)
    for level, lv in lives.items():
        out[level] = replace(out.get(level, NO_DRIFT), **{which: lv})
    return out


def judge_workload(cfg: RunConfig, name: str, m: Measured, drift: dict[str, Drift], profiles: dict[str, Profile],
                   where: Path, executor: Executor) -> list[pd.DataFrame]:
    """One workload's cells: every real point replayed with the step costs scaled by `drift`
    (latency), then the saturation bursts."""
    wc = cfg.workload(name)
    sims = simulate_points(wc, m.real, profiles, executor, drift)
    lat = accuracy.cells(m.real, m.rerun, sims, KEY, accuracy.LATENCY, "latency")
    lat.insert(1, "workload", name)
    if cfg.validation.drift_timed:     # the same replays at the profile's own speed: what the corrections earn
        plain = simulate_points(wc, m.real, profiles, executor, sides={"sim": 0.0})["sim"]
        lat = lat.merge(plain.melt(id_vars=KEY, value_vars=list(accuracy.LATENCY), var_name="metric",
                                   value_name="sim_uncorrected"), on=KEY + ["metric"], how="left")
    cells = [lat]
    if cfg.validation.saturation:
        wide = saturation(wc, profiles, where / "saturation.csv", drift)
        sat = accuracy.cells(*_sat_sides(wide), ["strategy"], accuracy.SATURATION, "saturation")
        sat.insert(1, "workload", name)
        cells.append(sat)
    return cells


def pooled_drift(drifts: dict[str, dict[str, Drift]]) -> dict[str, float]:
    """level -> the drift probe's factor the replays ran at (after the gate; 1 where it was left
    out or not applied), the geometric mean over workloads: what the machine's speed adds to the
    live factor, which is measured on replays already scaled by it."""
    by_level: dict[str, list[float]] = {}
    for per in drifts.values():
        for level, d in per.items():
            by_level.setdefault(level, []).append(d.factor)
    return {level: statistics.geometric_mean(factors) for level, factors in by_level.items()}


def live_record(profiles: dict[str, Profile], ratios: dict[str, dict[str, list[float]]],
                per_workload: dict[str, dict[str, Live]], out: Path, first=({}, {}), form: str = "factor",
                gate: float = 0.0, units: str = "cells", drift: dict[str, float] | None = None) -> dict:
    """accuracy.json's live section: each workload's leave-one-out factor (`per_workload`), the
    one pooled over every workload's `ratios`, the same two for the first-token correction (`first`:
    its values and its per-workload factors or delays, `form`), and the profiles (`profiles`: level
    -> the one its strategies replay on) rewritten with the pooled corrections (OUT/live_<profile>),
    times the drift factor the replays ran at (`drift`: level -> pooled_drift), so a live profile
    runs at the machine's speed during the validation whether or not the probe was applied.
    Each estimate is recorded as measured, with whether it passed `gate` (live.distinct) and so was
    applied; `units`: what the standard errors count (validation.se_units)."""
    if not ratios and not first[0]:
        return {}
    _, est, none = FIRST_FORMS.get(form, FIRST_FORMS["factor"])
    lives, firsts, written = live.pooled(ratios, units=units), live.pooled(first[0], est, units), {}
    for level in profiles:
        lv, ft, machine = lives.get(level, LIVE_NONE), firsts.get(level, none), (drift or {}).get(level, 1.0)
        if lv.cells or ft.cells:
            dst = out / f"live_{Path(profiles[level].path).name}"
            live.write_live_profile(profiles[level].path, dst, live.gated(lv, gate), live.gated(ft, gate), machine)
            written[level] = {"factor": lv.factor, "se": lv.se, "cells": lv.cells, "applied": live.distinct(lv, gate),
                              "drift": machine, "profile": str(dst),
                              "first_token": asdict(ft) | {"applied": live.distinct(ft, gate)}}
    as_dict = lambda per_w: {w: {lvl: asdict(lv) | {"applied": live.distinct(lv, gate)} for lvl, lv in per.items()}  # noqa: E731
                             for w, per in per_w.items()}
    return {"metric": live.METRIC, "method": "leave one workload out", "estimator": live.ESTIMATOR, "gate": gate,
            "se_units": units,
            "per_workload": as_dict(per_workload),
            "first_token": {"metric": live.FIRST_METRIC, "form": form, "per_workload": as_dict(first[1])},
            "pooled": written}


def config_text(cfg: RunConfig) -> str:
    """The config a validation ran with (no secret): `batchlab validate` with it, the same
    profiles and the same OUT re-judges the kept real runs without running them again."""
    tree = cfg.model_dump(mode="json")
    tree.get("backend", {}).pop("api_key", None)
    tree.pop("out", None)
    return ("# The config this validation ran with: the same `batchlab validate` with it re-judges the kept runs\n"
            + yaml.safe_dump(tree, sort_keys=False))


def _sweep(wc: RunConfig, path: Path, real: LentBackend, say) -> pd.DataFrame:
    """The workload's real sweep into `path` (resumed there), on the shared backend when local."""
    lend = real.get() if wc.executor.kind == "local" and not _complete(wc, path) else None
    return pd.read_csv(run_sweep(wc, path, progress=say, backend=lend) / "summary.csv")


def _against(drift: dict) -> str:
    if drift.get("against") != "profile time":
        return "as its fit predicts it"
    return "as timed on the server when profiled" + (
        f"; {drift['vs_prediction']:.2f}x as its fit predicts it" if drift.get("vs_prediction") is not None else "")


def interval_rule(cfg: RunConfig) -> str:
    """The rule that sizes a validation's intervals: validation.interval, but `held-out` needs a
    workload besides `base` to read its width from, and without one it is `step-cost`."""
    return cfg.validation.interval if cfg.validation.workloads else "step-cost"


def accuracy_record(cfg: RunConfig, profiles: dict[str, Profile], table: pd.DataFrame, summ: pd.DataFrame,
                    drifts: dict[str, dict[str, Drift]], out: Path) -> dict:
    """accuracy.json: the profiles, workloads, drift and load, and the per-metric figures (with and,
    where drift was corrected, without the correction)."""
    uncorrected = {}
    if cfg.validation.drift_timed:
        lat = table[table["kind"] == "latency"]
        err = ((lat["sim_uncorrected"] - lat["real"]) / lat["real"]).abs()
        uncorrected = {m: {"error_median": float(e.median()), "error_p90": float(e.quantile(0.9))}
                       for m, e in err.groupby(lat["metric"], sort=False)}
    return {"profiles": {lvl: {"path": p.path, "fit_rms_rel_error": p.sigma} for lvl, p in profiles.items()},
            "workloads": {"base": {}} | cfg.validation.workloads, "noise_runs": 2 if cfg.validation.noise else 1,
            "drift": {w: {lvl: {"factor": d.factor, "spread": d.spread, "timings": d.timings, "against": d.against,
                                "applied": cfg.validation.drift_applied and d.gated(cfg.validation.gate) is d}
                                | ({"vs_prediction": d.vs_prediction} if d.vs_prediction is not None else {})
                          for lvl, d in ds.items()} for w, ds in drifts.items()},
            "load_1min": _loads(out, ["base", *cfg.validation.workloads]),
            "reference_burst": {"rows": REFERENCE[0], "prompt": REFERENCE[1], "new_tokens": REFERENCE[2]},
            "interval": INTERVAL[interval_rule(cfg)],
            "metrics": summ.to_dict(orient="records"), "uncorrected": uncorrected,
            "by_workload": accuracy.by_workload(table)}


def _loads(out: Path, workloads: list[str]) -> dict[str, list[float]]:
    """workload -> [lowest, highest] 1-minute load average seen at its reference bursts (absent
    where none was recorded)."""
    seen = {}
    for w in workloads:
        path = out / w / "reference.csv"
        if path.is_file():
            load = pd.read_csv(path).get("load_1min")
            if load is not None and load.notna().any():
                seen[w] = [float(load.min()), float(load.max())]
    return seen


def _complete(cfg: RunConfig, path: Path) -> bool:
    """Every point of `cfg` already in the results directory `path` (nothing left to run there)."""
    summary = path / "summary.csv"
    return summary.is_file() and len(pd.read_csv(summary)) >= len(list(points(cfg)))


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
@click.option("--profile", "profiles", multiple=True,
              help="Profile JSON from `batchlab profile` (one per path: --strategy dynamic and continuous).")
@click.option("--twin", default=None, type=click.Path(dir_okay=False),
              help="A server's twin config (`batchlab profile` on the server writes it): its replays run there.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--out", default="results/validate", show_default=True, help="Output directory.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where points run (default: the config's executor.kind): ray runs real and simulated points as Ray tasks.")
@user_errors
def validate_cmd(config, profiles, overrides, out, executor, twin):
    """Run CONFIG (and its held-out workloads) on its real backend twice and on the simulator
    calibrated by PROFILE; report errors, the noise floor and 90 % interval coverage."""
    for flag, p in [("--profile", p) for p in profiles] + ([("--twin", twin)] if twin else []):
        if not Path(p).is_file():
            raise ConfigError(f"{flag}: file not found: {p}")
    cfg = load_config(config, list(overrides) + ([f"executor.kind={executor}"] if executor else []))
    if cfg.backend.role == TARGET and twin is None:
        raise ConfigError(f"backend.kind '{cfg.backend.kind}' batches for itself: give its twin with --twin "
                          "(`batchlab profile` on the server writes it)")
    if not profiles and twin is None:
        raise ConfigError("give the profiles to validate with --profile (or a server's twin with --twin)")
    load_profiles(list(profiles), twin)
    out_dir = Path(out)
    result = validate(cfg, list(profiles), out_dir, progress=lambda m: click.echo(f"  real: {m}"), twin=twin)
    for line in report_lines(result):
        click.echo(line)
    acc = json.loads((out_dir / "accuracy.json").read_text())
    for name, f in acc["drift"].items():
        if f:
            click.echo(f"drift ({name}): the machine ran the reference burst at " + ", ".join(
                f"{v['factor']:.2f}x the {lvl}-level profile's time ({_against(v)}; spread {100 * v['spread']:.0f}%)"
                for lvl, v in f.items()) + _drift_use(cfg.validation.drift, [v["applied"] for v in f.values()]))
    for line in live_lines(acc.get("live") or {}, cfg.validation.live, cfg.validation.first_token):
        click.echo(line)
    if acc["uncorrected"]:
        click.echo("without any correction (drift, live, first-token), median |error|: " + ", ".join(
            f"{m} {100 * v['error_median']:.1f}%" for m, v in acc["uncorrected"].items()))
    click.echo(f"wrote {out_dir / 'validation.csv'}, {out_dir / 'accuracy.json'}, {out_dir / 'validation.png'}")


def _drift_use(mode: str, applied: list[bool]) -> str:
    """What the replays did with the drift probe's reading."""
    if mode != "apply":
        return "; recorded, not applied (validation.drift: measure)"   # the live factor carries it instead
    return "; the replays were scaled by it" if all(applied) else "; applied where it passed the gate only"


def live_lines(rec: dict, on: bool, first_on: str = "off") -> list[str]:
    """What the live factor and the first-token correction did: each workload's (from the
    others), and the rewritten profiles."""
    lines = []
    delay = rec.get("first_token", {}).get("form") == "delay"
    for name, per_w, metric, what, switched in [
            ("live factor", rec.get("per_workload", {}), "p50 TPOT", "its replays were scaled by it", on),
            ("first-token delay" if delay else "first-token factor", rec.get("first_token", {}).get("per_workload", {}),
             "p50 TTFT", "each request waited it before the scheduler" if delay
             else "its prompt passes and front end were scaled by it", first_on != "off")]:
        if not switched:
            continue
        measured = {w: {lvl: v for lvl, v in per.items() if v["cells"]} for w, per in per_w.items()}
        if not any(measured.values()):
            lines.append(f"{name}: not measured (it needs a second workload: add one under validation.workloads)")
            continue
        lines += [live_row(f"{name} ({w}, from the other workloads' {metric})", per, what) for w, per in measured.items() if per]
    for lvl, v in rec.get("pooled", {}).items():
        ft = v.get("first_token", {})
        also = f", first-token {correction(ft)}{skipped(ft)}" if ft.get("cells") else ""
        machine = f", on the drift probe's {v['drift']:.2f}x" if v.get("drift", 1.0) != 1.0 else ""
        lines.append(f"live factor ({lvl}, every workload): {v['factor']:.2f}x{skipped(v)}{machine}{also}; "
                     f"profile with it: {v['profile']}")
    return lines


def live_row(head: str, per: dict[str, dict], what: str) -> str:
    """One workload's correction per level, and `what` it did, or that validation.gate left it out."""
    applied = [v.get("applied", True) for v in per.values()]
    mark = len(per) > 1 and not all(applied)          # a level apart from the rest says so itself
    text = ", ".join(f"{lvl} {correction(v, cells=True)}" + (skipped(v) if mark else "") for lvl, v in per.items())
    return f"{head}: {text}; " + (what if any(applied) else "not applied: within validation.gate standard errors of none")


def skipped(v: dict) -> str:
    """' (not applied: ...)' where validation.gate left a correction out (older records: applied)."""
    return "" if v.get("applied", True) else " (not applied: within validation.gate of none)"


def correction(v: dict, cells: bool = False) -> str:
    """A factor record as '1.23x (+-5%)', a delay record as '4.1 ms (+-0.6 ms)'; with `cells`, the count inside."""
    n = f", {v['cells']} cells" if cells else ""
    if "seconds" in v:
        return f"{1e3 * v['seconds']:.1f} ms (+-{1e3 * v['se']:.1f} ms{n})"
    return f"{v['factor']:.2f}x (+-{100 * v['se']:.0f}%{n})"
