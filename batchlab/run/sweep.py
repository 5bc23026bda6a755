"""A sweep: strategies x rates x repeats, each point written to disk the moment it finishes.

Rerunning into the same directory skips finished points (run/results.py holds the directory and
its CSV schema); a directory holding a point made with different settings is refused.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from batchlab.backends import make_backend
from batchlab.core.config import RunConfig
from batchlab.core.traffic import build_trace, read_trace_file, trace_rate
from batchlab.errors import ConfigError
from batchlab.run.point import run_point
from batchlab.run.results import ResultsDir, point_hash, request_rows, summary_row


def points(cfg: RunConfig) -> Iterator[tuple[str, float, int]]:
    """Rate-major order: all strategies run back to back on each (rate, repeat) trace.
    A replayed trace is one point per repeat, labelled with the trace's mean rate."""
    if cfg.traffic.arrival == "trace":
        rates = [round(trace_rate(read_trace_file(cfg.traffic.trace_file)), 6)]
    else:
        rates = cfg.traffic.rates
    for rate in rates:
        for repeat in range(cfg.traffic.repeats):
            for strategy in cfg.strategies:
                yield strategy, float(rate), repeat


def pending_points(cfg: RunConfig, done: dict[tuple, str], where: Path) -> list[tuple[str, float, int]]:
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
    import os
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


def run_sweep(cfg: RunConfig, out: str | Path, on_point: Callable[[dict], None] | None = None,
              progress: Callable[[str], None] | None = None) -> Path:
    """Run every missing point of the sweep into `out`; returns the directory."""
    results = ResultsDir(out)
    done = results.done_points()
    todo = pending_points(cfg, done, results.path)
    results.path.mkdir(parents=True, exist_ok=True)
    results.drop_partial(done)
    (results.path / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    if not todo:
        return results.path
    backend = make_backend(cfg)
    describe = backend.describe()
    setup = {**describe, **run_environment()}
    (results.path / "setup.json").write_text(json.dumps(setup, indent=2, default=str))
    try:
        for strategy, rate, repeat in todo:
            trace = build_trace(cfg.traffic, rate, repeat)
            if progress:
                progress(f"{strategy} @ {rate:g} req/s (repeat {repeat}): {len(trace)} requests")
            res = run_point(cfg, strategy, rate, repeat, backend, trace)
            model = str(describe.get("model", ""))
            rows = request_rows(cfg, strategy, rate, repeat, res.requests, model)
            summary = summary_row(cfg, strategy, rate, repeat, model, res.summary, res.meta)
            results.append_point(rows, summary)
            if on_point:
                on_point(summary)
    finally:
        asyncio.run(backend.close())
    return results.path
