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
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchlab.backends import make_backend, preflight
from batchlab.backends.base import Backend
from batchlab.core.applies import config_warnings
from batchlab.core.config import RunConfig
from batchlab.core.request import Status
from batchlab.core.traffic import build_trace, read_trace, trace_rate
from batchlab.errors import ConfigError
from batchlab.run.experiment import differences, experiment, experiment_digest, recorded_config
from batchlab.run.point import PointResult, run_point
from batchlab.run.results import ResultsDir, check_location
from batchlab.run.schema import Key, canonical, point_hash, request_rows, strategy_rank, summary_row
from batchlab.schedulers import scheduler_class

LINK_NAME = "latest"


def points(cfg: RunConfig) -> Iterator[Key]:
    """Canonical order, rate-major: all strategies run back to back on each (rate, repeat) trace;
    rates from the lowest, strategies naive, dynamic, continuous, server.
    A replayed trace is one point per repeat, labelled with the trace's mean rate."""
    if cfg.traffic.arrival == "trace":
        rates = [round(trace_rate(read_trace(cfg.traffic).items), 6)]
    else:
        rates = sorted(set(cfg.traffic.rates))
    strategies = sorted(set(cfg.strategies), key=strategy_rank)
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
            raise ConfigError(f"{where}: point {strategy} @ {rate:g} req/s (repeat {repeat}) was "
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
    experiment: dict[str, Any]          # its identity (run/results.py `experiment`)
    total: int                          # points in this command's sweep
    todo: list[Key]                     # of them, not yet recorded
    backend: Backend | None = None      # made only when there is something to run
    warnings: list[str] = field(default_factory=list)

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


def plan_sweep(cfg: RunConfig, out: str | Path) -> SweepPlan:
    """Check the whole sweep and open nothing for writing; raises ConfigError for a user mistake."""
    for strategy in cfg.strategies:                     # a policy of your own is imported here
        scheduler_class(strategy)
    grid = list(points(cfg))                            # a replayed trace is read (and checked) here
    exp = experiment(cfg)
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
        plan.backend = make_backend(cfg)
    return plan


def execute(plan: SweepPlan, on_point: Callable[[PointDone], None] | None = None,
            progress: Callable[[str], None] | None = None) -> Path:
    """Write: claim the directory, repair what a crash left, run the missing points."""
    results = plan.results
    try:
        with results.writing():
            results.claim(plan.experiment)
            scan = results.scan()
            results.repair(scan)
            done = set(scan.points)
            _write_config(plan, done)
            if plan.link is not None:
                _point_link(plan.link, results.path)
            todo = [k for k in plan.todo if k not in done]
            if todo:
                describe = plan.backend.describe()
                setup = {**describe, **run_environment()}
                results.write_text(results.path / "setup.json", json.dumps(setup, indent=2, default=str) + "\n")
            in_order = True
            for key in todo:
                report = _run_one(plan, key, str(describe.get("model", "")), progress)
                in_order = in_order and all(canonical(k) < canonical(key) for k in done)
                done.add(key)
                _write_config(plan, done)
                if on_point:
                    on_point(report)
            if not in_order:                    # a rerun point landed after later ones
                results.put_in_order()
    finally:
        if plan.backend is not None:
            asyncio.run(plan.backend.close())
    return results.path


def run_sweep(cfg: RunConfig, out: str | Path, on_point: Callable[[PointDone], None] | None = None,
              progress: Callable[[str], None] | None = None) -> Path:
    """Run every missing point of the sweep into `out`; returns the experiment's directory."""
    return execute(plan_sweep(cfg, out), on_point, progress)


def _run_one(plan: SweepPlan, key: Key, model: str, progress: Callable[[str], None] | None) -> PointDone:
    strategy, rate, repeat = key
    trace = build_trace(plan.cfg.traffic, rate, repeat)
    if progress:
        progress(f"{strategy} @ {rate:g} req/s (repeat {repeat}): {len(trace)} requests")
    res: PointResult = run_point(plan.cfg, strategy, rate, repeat, plan.backend, trace)
    rows = request_rows(plan.cfg, strategy, rate, repeat, res.requests, model)
    row = plan.results.append_point(rows, summary_row(plan.cfg, strategy, rate, repeat, model, res.summary, res.meta))
    errors = Counter(r.error or "unknown error" for r in res.requests if r.status is Status.FAILED)
    top = " ".join(errors.most_common(1)[0][0].split())[:200] if errors else ""   # one line, whatever the error
    return PointDone(row, len(rows), sum(errors.values()), top)


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
    return f"{slug}-{experiment_digest(exp)}"


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
        text = recorded_config(plan.cfg.tree(), done, experiment_digest(plan.experiment), plan.path)
        plan.results.write_text(path, text)
    else:
        path.unlink(missing_ok=True)


def _point_link(link: Path, target: Path) -> None:
    """Atomically point `link` at `target`, a sibling, by a relative name."""
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target.name, tmp, target_is_directory=True)
    os.replace(tmp, link)
