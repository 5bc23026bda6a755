"""A sweep: strategies x rates x repeats, each point written to disk the moment it finishes.

`plan_sweep` checks everything and writes nothing: the output location, that the directory holds
this experiment (run/results.py), which points are missing, the input files and the backend
(preflight). `execute` then takes the directory's lock, repairs what a crash left, runs the missing
points in canonical order and appends each one as it finishes. An `out` named `latest` (the
default, results/latest) is a link: each experiment gets its own sibling directory
`<name>-<digest>`, and the link points at the one run last, so a changed setting starts a fresh
directory instead of being refused or mixed in.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from batchlab.backends import TARGET, make_backend
from batchlab.backends.base import Backend
from batchlab.backends.baselines import BASELINES
from batchlab.core.config import RunConfig
from batchlab.core.request import Status
from batchlab.core.traffic import build_trace, check_inputs, read_trace, trace_rate
from batchlab.errors import ConfigError, RunFailed
from batchlab.run.config import config_warnings, validate
from batchlab.run.executors import Executor, LocalExecutor, Need, RayExecutor, make_executor, server_resource
from batchlab.run.experiment import config_tree, differences, digest, identity, input_files, point_hash, with_absolute_inputs
from batchlab.run.point import PointResult, run_point
from batchlab.run.results import RenderedRows, ResultsDir, check_location, recorded_config, render_rows
from batchlab.run.schema import Key, canonical, request_rows, summary_row
from batchlab.run.strategies import rank
from batchlab.schedulers import scheduler_class

LINK_NAME = "latest"


def points(cfg: RunConfig) -> Iterator[Key]:
    """Canonical order, rate-major: all strategies run back to back on each (rate, repeat) trace;
    rates from the lowest, strategies naive, dynamic, continuous, server.
    A replayed trace is one point per repeat, labelled with the trace's mean rate; a closed loop's
    points are its user counts (traffic.concurrency), held in the same `rate` slot."""
    if cfg.traffic.arrival == "trace":
        rates = [round(trace_rate(read_trace(cfg.traffic).items), 6)]
    else:
        rates = cfg.traffic.levels
    strategies = sorted(set(cfg.strategies), key=rank)
    for rate in rates:
        for repeat in range(cfg.traffic.repeats):
            for strategy in strategies:
                yield strategy, float(rate), repeat


def pending_points(cfg: RunConfig, done: dict[tuple, str], where: Path) -> list[Key]:
    """The points of the sweep not yet recorded in `done`; a point recorded with other
    settings is refused rather than mixed."""
    todo = []
    for key in points(cfg):
        strategy, rate, repeat = key
        if key in done and done[key] != point_hash(cfg, strategy):
            raise ConfigError(f"{where}: point {strategy} @ {rate:g} {cfg.traffic.load_unit} (repeat {repeat}) was "
                              "recorded with different settings; use another --out directory")
        if key not in done:
            todo.append(key)
    return todo


def run_environment() -> dict[str, Any]:
    """Where a sweep ran, for the report: machine, OS, Python, the libraries every run uses."""
    import platform
    from datetime import UTC, datetime
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    return {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "os": platform.platform(),
            "python": platform.python_version(), "libraries": {n: v(n) for n in ("batchlab", "numpy", "pandas")},
            "started_utc": datetime.now(UTC).isoformat(timespec="seconds")}


@dataclass
class SweepPlan:
    """Everything checked before the first byte is written."""
    cfg: RunConfig
    results: ResultsDir                 # the experiment's directory
    link: Path | None                   # `latest`, to point at it (None: out is the directory itself)
    experiment: dict[str, Any]          # its identity (run/experiment.py)
    total: int                          # points in this command's sweep
    todo: list[Key]                     # of them, not yet recorded
    backend: Backend | None = None      # made only when there is something to run here (local executor)
    executor: Executor | None = None    # where points run; connected only when there is something to run
    warnings: list[str] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)    # setup.json as written
    setup_written: bool = False
    owns_backend: bool = True           # False: the caller lent it (validate's reference bursts share it) and closes it

    @property
    def path(self) -> Path:
        return self.results.path


@dataclass(frozen=True)
class PointDone:
    """What the progress display hears after each point."""
    summary: dict[str, Any]             # the summary row as written
    requests: int                       # request rows written (warm-up included)
    failed: int                         # of them, failed
    error: str                          # the most common error among the failed ('' if none)


def plan_sweep(cfg: RunConfig, out: str | Path, backend: Backend | None = None) -> SweepPlan:
    """Check the whole sweep and open nothing for writing; raises ConfigError for a user mistake.
    `backend`: use this one (already made by the caller, who closes it) for local points."""
    if cfg.backend.role != TARGET:
        for strategy in cfg.strategies:                 # a policy of your own is imported here
            if strategy not in BASELINES:
                scheduler_class(strategy)
    grid = list(points(cfg))                            # a replayed trace is read (and checked) here
    exp = identity(cfg)
    results, link = _choose_directory(cfg, Path(out), exp)
    check_location(results.path)
    if link is not None:
        check_location(link.parent)
    if results.busy():
        raise ConfigError(f"{results.path}: another batchlab process is writing here; wait for it to end")
    done = _recorded_points(results, exp, cfg)
    todo = pending_points(cfg, done, results.path)
    plan = SweepPlan(cfg, results, link, exp, total=len(grid), todo=todo)
    # NOTE: after every input check, before the backend is made (a model load) and before the first file
    # is written: a bad trace or ShareGPT file (read row by row, caps applied with real lengths), or a
    # backend that cannot work (a model path that does not exist, a server without this model) ends here
    # in one line. Traces themselves are built only when their points run. A finished sweep (nothing to
    # run) only needs the key warnings.
    plan.warnings += preflight(cfg) if todo else config_warnings(cfg)
    if todo:
        plan.executor = make_executor(cfg.executor, _declared_resources(cfg))
        if plan.executor.kind == "local":       # on Ray, each worker makes its own
            plan.backend, plan.owns_backend = (backend, False) if backend is not None else (make_backend(cfg), True)
    return plan


def preflight(cfg: RunConfig) -> list[str]:
    """Check everything a run will read, before its first file is written: the keys it ignores,
    the trace or ShareGPT files (row by row, and the per-point caps with real lengths), and the
    backend's own inputs (a preset or profile, a model path or hub cache, a server and its model
    list). Raises ConfigError (one line) on the first problem; returns warning lines."""
    return (config_warnings(cfg) + check_inputs(cfg.traffic) + cfg.backend.preflight(cfg)
            + cfg.backend.check_baselines(cfg, [s for s in cfg.strategies if s in BASELINES]))


def _declared_resources(cfg: RunConfig) -> dict[str, float]:
    """Custom resources a Ray started here declares: one unit per server points are sent to."""
    server = cfg.backend.holds(0, 1).server
    if cfg.executor.kind == "ray" and server:
        return {server_resource(server): 1.0}
    return {}


def execute(plan: SweepPlan, on_point: Callable[[PointDone], None] | None = None,
            progress: Callable[[str], None] | None = None, task: Callable[[RunConfig, Key], PointRows] | None = None) -> Path:
    """Write: claim the directory, repair what a crash left, run the missing points (on the plan's
    executor) and append each one as it finishes. `task` replaces the Ray task's function (tests
    use it to kill a worker mid-point). Raises RunFailed after the others are written if a point's
    worker died more often than executor.max_retries allows."""
    results = plan.results
    try:
        with results.writing():
            results.claim(plan.experiment)
            scan = results.scan()
            results.repair(scan)
            done = set(scan.points)
            before = sorted(done, key=canonical)
            _write_config(plan, done)
            if plan.link is not None:
                _point_link(plan.link, results.path)
            todo = [k for k in plan.todo if k not in done]
            written: dict[Key, dict] = {}
            failures = _run_points(plan, todo, done, written, on_point, progress, task) if todo else []
            keys = before + list(written)
            if keys != sorted(keys, key=canonical):     # NOTE: whatever order points finished in, the files end canonical
                results.put_in_order(written)
            if failures:
                raise RunFailed(f"{len(failures)} point(s) not run: " + "; ".join(failures[:3])
                                + ("; ..." if len(failures) > 3 else "") + ". The other points are saved; rerun the "
                                "same command to run the missing ones")
    finally:
        if plan.backend is not None and plan.owns_backend:
            asyncio.run(plan.backend.close())
        if plan.executor is not None:
            plan.executor.close()
    return results.path


def run_sweep(cfg: RunConfig, out: str | Path, on_point: Callable[[PointDone], None] | None = None,
              progress: Callable[[str], None] | None = None, backend: Backend | None = None) -> Path:
    """Run every missing point of the sweep into `out`; returns the experiment's directory.
    `backend`: a backend the caller made and will close (local points run on it)."""
    return execute(plan_sweep(cfg, out, backend), on_point, progress)


def _run_points(plan: SweepPlan, todo: list[Key], done: set[Key], written: dict[Key, dict],
                on_point: Callable[[PointDone], None] | None, progress: Callable[[str], None] | None,
                task: Callable[[RunConfig, Key], PointRows] | None) -> list[str]:
    """Run `todo` on the plan's executor; write each point the moment it is back. Returns one line
    per point that could not be run."""
    executor = plan.executor or LocalExecutor()
    need = point_need(plan.cfg, executor)
    local = executor.kind == "local"
    if local:       # NOTE: the plan's backend (one model load) serves every point, in this process, in order
        calls = [(plan.cfg, key, plan.backend) for key in todo]
        baselines = sorted({k[0] for k in todo if k[0] in BASELINES})
        cpus, setup = (plan.cfg.backend.prepare_baselines(plan.cfg, baselines, functools.partial(click.echo, err=True))
                       if baselines else (None, {}))
        fn: Callable = _announced(functools.partial(compute_point, baseline_cpus=cpus), progress)
        _write_setup(plan, plan.backend.describe() | ({"baselines": setup} if setup else {}), executor, need, set())
    else:
        cfg = absolute_inputs(plan.cfg)
        calls, fn = [(cfg, key) for key in todo], task or point_task
        if progress:
            progress(f"{len(todo)} points sent to {executor.where()}")
    failures, nodes = [], set()
    for i, fin in enumerate(executor.map(fn, calls, need)):
        key = todo[fin.index]
        if fin.error is not None:
            failures.append(f"{key[0]} @ {key[1]:g} {plan.cfg.traffic.load_unit} (repeat {key[2]}): {fin.error}")
            continue
        out: PointRows = fin.value
        nodes.add(fin.node)
        if not local and not plan.setup_written:
            _write_setup(plan, out.setup, executor, need, nodes)
        written[key] = plan.results.append_point(out.requests, out.summary)
        done.add(key)
        _write_config(plan, done)
        if progress and not local:
            progress(f"{i + 1} of {len(todo)} points back from {executor.kind}")
        if on_point:
            on_point(PointDone(written[key], out.requests.count, out.failed, out.error))
    if nodes and not local:
        _write_setup(plan, None, executor, need, nodes)     # the placement, with every node that ran a point
    return failures


@dataclass(frozen=True)
class PointRows:
    """One finished point as the writing process receives it: a pure function of (config, point)."""
    key: Key
    requests: RenderedRows              # request rows, as requests.csv's text
    summary: dict[str, Any]             # the summary row, before the ledger columns
    failed: int                         # requests that failed
    error: str                          # their most common error ('' if none)
    setup: dict[str, Any]               # the backend's facts (describe()) where it ran


def compute_point(cfg: RunConfig, key: Key, backend: Backend, baseline_cpus: str | None = None) -> PointRows:
    """Run one point on `backend` (a managed baseline's: on its server, started for the point on
    `baseline_cpus`) and turn it into rows; writes nothing."""
    strategy, rate, repeat = key
    describe = backend.describe()
    model = str(describe.get("model", ""))
    trace = build_trace(cfg.traffic, rate, repeat)
    if strategy in BASELINES:
        backend = cfg.backend.baseline(cfg, strategy, baseline_cpus)
        describe = backend.describe()
    res: PointResult = run_point(cfg, strategy, rate, repeat, backend, trace)
    rows = request_rows(cfg, strategy, rate, repeat, res.requests, model)
    errors = Counter(r.error or "unknown error" for r in res.requests if r.status is Status.FAILED)
    top = " ".join(errors.most_common(1)[0][0].split())[:200] if errors else ""   # one line, whatever the error
    summary = summary_row(cfg, strategy, rate, repeat, model, res.summary, res.meta)
    return PointRows(key, render_rows(rows), summary, sum(errors.values()), top, describe)


_WORKER_BACKEND: dict[str, Backend] = {}


def point_task(cfg: RunConfig, key: Key) -> PointRows:
    """A point as a Ray task. The worker process builds the backend once per config and keeps it
    for the next point it is given (a model is loaded once per worker, not once per point)."""
    ident = cfg.model_dump_json()
    if ident not in _WORKER_BACKEND:
        for old in _WORKER_BACKEND.values():
            asyncio.run(old.close())
        _WORKER_BACKEND.clear()
        _WORKER_BACKEND[ident] = make_backend(cfg)
    return compute_point(cfg, key, _WORKER_BACKEND[ident])


def point_need(cfg: RunConfig, executor: Executor) -> Need:
    """What a point holds while it runs on Ray, as its backend kind says (`holds`): e.g. one CPU
    for the simulator; a GPU, or its torch threads' CPUs, for a model; a server's own resource
    (one point at a time per server). Locally points run one after another."""
    if not isinstance(executor, RayExecutor):
        return Need(1)
    h = cfg.backend.holds(executor.gpus(), executor.node_cpus())
    extra = ((server_resource(h.server), 1.0),) if h.server is not None else ()
    return Need(h.cpus, num_gpus=h.gpus, resources=extra)


def absolute_inputs(cfg: RunConfig) -> RunConfig:
    """The config with input files named by absolute paths: a Ray worker may start elsewhere
    (on a cluster the files must be at the same path on every node)."""
    return validate(with_absolute_inputs(cfg.model_dump(mode="json"), input_files(cfg)))


def _announced(fn: Callable, progress: Callable[[str], None] | None) -> Callable:
    def run(cfg: RunConfig, key: Key, backend: Backend) -> PointRows:
        if progress:
            strategy, rate, repeat = key
            progress(f"{strategy} @ {rate:g} {cfg.traffic.load_unit} (repeat {repeat})")
        return fn(cfg, key, backend)
    return run


def _write_setup(plan: SweepPlan, describe: dict[str, Any] | None, executor: Executor, need: Need, nodes: set[str]) -> None:
    """setup.json: the backend's facts, the machine, and how points were placed (one line)."""
    if describe is not None:
        plan.setup = {**describe, **run_environment()}
    placed = executor.where() + (f"; each point holds {need.text()}" if executor.kind == "ray" else "")
    if nodes:
        placed += f"; points ran on {', '.join(sorted(nodes))}"
    plan.setup["placement"] = placed
    plan.setup_written = True
    plan.results.write_text(plan.path / "setup.json", json.dumps(plan.setup, indent=2, default=str) + "\n")


def _choose_directory(cfg: RunConfig, out: Path, exp: dict[str, Any]) -> tuple[ResultsDir, Path | None]:
    """`out` itself, or, when out is named `latest` and is not a real directory, the experiment's
    own sibling directory with `out` as the link to it."""
    if out.name != LINK_NAME or (out.is_dir() and not out.is_symlink()):
        return ResultsDir(out), None
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output directory {out}: is a file, not a directory")
    return ResultsDir(out.parent / experiment_dirname(cfg, exp)), out


def experiment_dirname(cfg: RunConfig, exp: dict[str, Any]) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.name).strip("-.") or "batchlab"
    return f"{slug}-{digest(exp)}"


def _recorded_points(results: ResultsDir, exp: dict[str, Any], cfg: RunConfig) -> dict[Key, str]:
    """The intact points already in the directory; refuses a directory of another experiment."""
    if not results.path.is_dir():
        return {}
    there = results.recorded_experiment()
    suggest = results.path.parent / experiment_dirname(cfg, exp)
    if there is None:
        if results.has_results():
            raise ConfigError(f"{results.path} holds results without an experiment record (an older batchlab, or "
                              f"hand-made); they cannot be resumed or extended: use --out {suggest}")
        return {}
    scan = results.scan()
    if there != exp and scan.points:
        raise ConfigError(f"{results.path} holds another experiment, recorded with different settings "
                          f"({differences(there, exp)}); use --out {suggest} (or an --out named latest: "
                          "a directory per experiment)")
    return scan.done if there == exp else {}


def _write_config(plan: SweepPlan, done: set[Key]) -> None:
    path = plan.path / "config.yaml"
    if done:
        text = recorded_config(config_tree(plan.cfg), done, digest(plan.experiment), plan.path)
        plan.results.write_text(path, text)
    else:
        path.unlink(missing_ok=True)


def _point_link(link: Path, target: Path) -> None:
    """Atomically point `link` at `target`, a sibling, by a relative name."""
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target.name, tmp, target_is_directory=True)
    os.replace(tmp, link)
