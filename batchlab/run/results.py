"""The results directory and its CSV schema: what a sweep writes, row by row.

`requests.csv` holds one row per request with the run's settings on every row (REQUEST_COLUMNS);
`summary.csv` one row per point (`summary_row`). A point counts as done once its summary row
exists, so a killed sweep loses at most the point in flight. Each row carries `point_hash`, a
digest of every setting that shapes that point, so a directory never mixes settings silently.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from batchlab.core.breakdown import PHASES
from batchlab.core.config import RunConfig
from batchlab.core.metrics import per_request
from batchlab.core.request import Request

REQUEST_COLUMNS = [
    "request_id", "strategy", "rate", "repeat", "seed", "backend", "model", "knobs", "point_hash",
    "status", "error", "warmup", "prompt_len", "output_len", "max_new_tokens",
    "arrival_time", "scheduled_time", "first_token_time", "completion_time",
    "queue_wait", "ttft", "tpot", "e2e", "itl_max", "num_preemptions", "trigger",
    *PHASES,
]
KEY = ("strategy", "rate", "repeat")


def point_hash(cfg: RunConfig, strategy: str) -> str:
    """Digest of everything that shapes one strategy's points (not the list of rates/repeats)."""
    shape = {"backend": cfg.backend.model_dump(), "knobs": cfg.knobs(strategy),
             "traffic": cfg.traffic.model_dump(exclude={"rates", "repeats"}), "slo": cfg.slo.model_dump()}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _fmt(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(float(v))              # numpy floats repr as 'np.float64(...)'
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def summary_row(cfg: RunConfig, strategy: str, rate: float, repeat: int, model: str,
                summary: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One point's row of summary.csv: its key and settings, the metrics, then backend facts."""
    return {"strategy": strategy, "rate": rate, "repeat": repeat, "seed": cfg.traffic.seed,
            "backend": cfg.backend.kind, "model": model, "point_hash": point_hash(cfg, strategy),
            **summary, **(meta or {})}


def request_rows(cfg: RunConfig, strategy: str, rate: float, repeat: int, requests: list[Request],
                 model: str) -> list[dict]:
    common = {"strategy": strategy, "rate": rate, "repeat": repeat, "seed": cfg.traffic.seed,
              "backend": cfg.backend.kind, "model": model, "point_hash": point_hash(cfg, strategy),
              "knobs": ";".join(f"{k}={v}" for k, v in cfg.knobs(strategy).items())}
    rows = []
    for r in requests:
        m = per_request(r)
        gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
        row = common | m | {
            "request_id": r.request_id, "status": r.status.value, "error": r.error or "",
            "warmup": r.arrival_time < cfg.traffic.warmup_s, "prompt_len": r.prompt_len,
            "output_len": r.output_len, "max_new_tokens": r.max_new_tokens,
            "arrival_time": r.arrival_time, "scheduled_time": r.scheduled_time,
            "first_token_time": r.first_token_time, "completion_time": r.completion_time,
            "itl_max": max(gaps) if gaps else None, "num_preemptions": r.num_preemptions,
            "trigger": r.trigger,
        }
        for phase in PHASES:
            row[phase] = r.breakdown.get(phase, 0.0 if r.status.value == "finished" else None)
        rows.append({k: _fmt(row.get(k)) for k in REQUEST_COLUMNS})
    return rows


class ResultsDir:
    """The output directory of a sweep: CSVs appended point by point, config alongside."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.requests_csv = self.path / "requests.csv"
        self.summary_csv = self.path / "summary.csv"

    def done_points(self) -> dict[tuple, str]:
        """(strategy, rate, repeat) -> point_hash of every finished point."""
        if not self.summary_csv.is_file():
            return {}
        with self.summary_csv.open(newline="") as f:
            return {(row["strategy"], float(row["rate"]), int(row["repeat"])): row["point_hash"]
                    for row in csv.DictReader(f)}

    def drop_partial(self, done: dict[tuple, str]) -> None:
        """Remove request rows of points that never got a summary row (killed mid-write)."""
        if not self.requests_csv.is_file():
            return
        with self.requests_csv.open(newline="") as f:
            rows = list(csv.DictReader(f))
        keep = [r for r in rows if (r["strategy"], float(r["rate"]), int(r["repeat"])) in done]
        if len(keep) != len(rows):
            self._write(self.requests_csv, REQUEST_COLUMNS, keep, mode="w")

    @staticmethod
    def _write(path: Path, columns: list[str], rows: list[dict], mode: str = "a") -> None:
        new = mode == "w" or not path.is_file() or path.stat().st_size == 0
        with path.open(mode, newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerows(rows)
            f.flush()

    def append_point(self, req_rows: list[dict], summary_row: dict) -> None:
        self._write(self.requests_csv, REQUEST_COLUMNS, req_rows)
        columns = list(summary_row)
        if self.summary_csv.is_file() and self.summary_csv.stat().st_size:
            with self.summary_csv.open(newline="") as f:
                columns = next(csv.reader(f))
        self._write(self.summary_csv, columns, [{k: _fmt(v) for k, v in summary_row.items()}])


