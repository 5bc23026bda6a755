"""Reading a results directory back: summary.csv, requests.csv, config.yaml and setup.json.

Every report and plot starts here, never from in-memory state. Numbers come back as floats
(an empty requests.csv included), and an inf read from a CSV counts as missing: no time a
table or an axis can show.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from batchlab.errors import ConfigError


def load_results(results_dir: Path) -> tuple[pd.DataFrame, dict, dict]:
    summary_csv = results_dir / "summary.csv"
    if not summary_csv.is_file():
        raise ConfigError(f"{results_dir}: no summary.csv (run `batchlab run --out {results_dir}` first)")
    summary = _numeric(pd.read_csv(summary_csv), failed_latencies=True)
    summary = summary.dropna(subset=["strategy", "rate"])       # a row that names no point is no point
    if summary.empty:
        raise ConfigError(f"{results_dir}: summary.csv holds no finished point yet")
    setup_path = results_dir / "setup.json"
    setup = json.loads(setup_path.read_text()) if setup_path.is_file() else {}
    return summary, setup, load_config_of(results_dir)


def load_config_of(results_dir: Path) -> dict:
    """The config.yaml a run recorded ({} when there is none)."""
    cfg_path = Path(results_dir) / "config.yaml"
    return yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else {}


def load_requests(results_dir: Path) -> pd.DataFrame | None:
    path = results_dir / "requests.csv"
    if not path.is_file():
        return None
    rows = pd.read_csv(path, dtype={"request_id": str, "trigger": str, "error": str, "class": str, "tenant": str},
                       keep_default_na=True)
    return _numeric(rows)


TEXT = {"request_id", "strategy", "backend", "model", "knobs", "point_hash", "status", "error", "trigger",
        "class", "tenant"}


def _numeric(df: pd.DataFrame, failed_latencies: bool = False) -> pd.DataFrame:
    """Numbers as floats, an empty file's included (pandas reads those as text), and inf as
    missing: a stamp of inf (a trace time of inf) is no time a plot or table can show. A column
    with any text in it (a backend's fact) stays as it is.
    NOTE: with `failed_latencies`, +inf stays in summary latency columns: there it means the
    percentile reaches failed requests (core/metrics.py counts a failure as an infinite latency),
    which tables print as "failed" and curves leave out."""
    for c in df:
        v = pd.to_numeric(df[c], errors="coerce")
        if c not in TEXT and v.notna().sum() == df[c].notna().sum():
            keep = failed_latencies and c.startswith(LATENCIES)
            df[c] = v.astype(float).replace([-np.inf] if keep else [np.inf, -np.inf], np.nan)
    return df


LATENCIES = ("ttft_", "tpot_", "e2e_", "queue_wait_")
