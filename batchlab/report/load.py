"""Reading a results directory back: summary.csv, requests.csv, config.yaml and setup.json.

Every report and plot starts here, never from in-memory state. Numbers come back as floats
(an empty requests.csv included), and an inf read from a CSV counts as missing: no time a
table or an axis can show. A point whose rows are not all there as written is left out, and
`damaged_points` says what was found instead, without guessing how it came about.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from batchlab.errors import ConfigError
from batchlab.run.ledger import parse_key, read_records
from batchlab.run.results import ResultsDir
from batchlab.run.schema import KEY, REQUEST_COLUMNS, Key


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


def damaged_points(results_dir: Path) -> tuple[dict[Key, str], int]:
    """(what was found for each point that is not intact, how many points are intact).
    NOTE: only what the files show. A point's summary row records the count and digest of its
    request rows: fewer rows than it records, or none of it at all, is an incomplete point; as
    many rows with another digest were changed after they were written (edited or corrupted).
    Whether a killed run, a full disk or a hand did it, the files cannot tell."""
    results_dir = Path(results_dir)
    scan = ResultsDir(results_dir).scan()
    rows = Counter(_keys(results_dir / "requests.csv", REQUEST_COLUMNS))
    header, records, _ = read_records(results_dir / "summary.csv")
    recorded: dict[Key | None, list[str]] = {}
    for key, fields in zip(_keys(results_dir / "summary.csv", header or []), (r.fields for r in records)):
        recorded.setdefault(key, []).append(fields[header.index("num_rows")] if "num_rows" in header else "")
    found = {}
    for key in scan.dropped:
        counts = recorded.get(key, [])
        if len(counts) > 1:
            found[key] = f"was recorded {len(counts)} times (as many summary rows)"
        elif not counts:
            found[key] = "was incomplete (its request rows have no summary row)"
        elif counts[0].isdigit() and rows[key] < int(counts[0]):
            found[key] = f"was incomplete (requests.csv holds {rows[key]} of the {counts[0]} rows its summary row records)"
        else:
            found[key] = ("was changed after it was written (its request rows do not match the digest its summary "
                          "row records: edited or corrupted)")
    return found, len(scan.points)


def _keys(path: Path, columns: list[str]) -> list[Key | None]:
    """The (strategy, rate, repeat) of each complete record of a CSV file with `columns` (None: unreadable)."""
    _, records, _ = read_records(path)
    if not set(KEY) <= set(columns):
        return []
    at = tuple(columns.index(c) for c in KEY)
    return [parse_key(r.fields, at) for r in records]


def load_config_of(results_dir: Path) -> dict:
    """The config.yaml a run recorded ({} when there is none)."""
    cfg_path = Path(results_dir) / "config.yaml"
    return yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else {}


def config_value(config: dict, dotted: str | None):
    """A dotted key's value in config.yaml's tree (None if absent)."""
    node = config
    for k in (dotted or "").split("."):
        node = node.get(k) if isinstance(node, dict) else None
    return node


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
