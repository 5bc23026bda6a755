"""How wide should a validation's 90 % intervals be? Each interval rule, re-judged on kept cells.

`batchlab validate` writes every cell it judged to validation.csv: the real run, its rerun, the
replay and the replays with every step cost moved by one standard error (`sim_lo`, `sim_hi`).
Both interval rules (`validation.interval`, batchlab/calibrate/accuracy.py) are built from those
columns alone, so this re-judges kept validations under each rule without running anything again:
per validation and rule, the share of cells the interval held (all cells and per metric) and its
median width: step-cost's half width over the replay, held-out's bound q on the relative error.
An honest 90 % interval holds 85-95 % of cells.

Usage: python benchmarks/intervals.py NAME=DIR ... [--json FILE]
  DIR is a validation's directory (validation.csv inside) or a copy of its validation.csv (the
  vLLM validations' cells are kept under docs/results/cells/). NAME labels it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from batchlab.calibrate import accuracy
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors

COLUMNS = ("kind", "workload", "strategy", "rate", "repeat", "metric", "real", "sim", "sim_lo", "sim_hi", "real_b")


def cells_of(path: Path) -> pd.DataFrame:
    """A kept validation's cells, as `validate` built them before judging them."""
    csv = path if path.suffix == ".csv" else path / "validation.csv"
    if not csv.is_file():
        raise ConfigError(f"{path}: no validation.csv (a `batchlab validate` or benchmarks/twin.py validation directory)")
    table = pd.read_csv(csv)
    missing = [c for c in COLUMNS if c not in table]
    if missing:
        raise ConfigError(f"{csv}: no column {', '.join(missing)}; nothing was written")
    return table[list(COLUMNS)]


def judge(table: pd.DataFrame, rule: str) -> dict:
    """One rule's intervals on one validation's cells."""
    t = accuracy.with_errors(table, rule=rule)
    # NOTE: held-out bounds the error itself (upper end infinite past q = 1), so its width is q
    width = (t["hi"] - t["sim"]) / t["sim"] if rule == "step-cost" else t["sim"] / t["lo"] - 1
    return {"coverage": float(t["inside"].mean()), "cells": len(t), "width_median": float(width.median()),
            "by_metric": {m: float(g["inside"].mean()) for m, g in t.groupby("metric", sort=False)}}


def parse(specs: list[str]) -> dict[str, Path]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"{spec!r}: expected NAME=DIR")
        if name in out:
            raise ConfigError(f"{name!r} named twice")
        out[name] = Path(path)
    return out


@user_errors
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validations", nargs="+", metavar="NAME=DIR")
    ap.add_argument("--json", help="write the record here")
    args = ap.parse_args()
    tables = {name: cells_of(path) for name, path in parse(args.validations).items()}
    runs = {name: {rule: judge(t, rule) for rule in accuracy.RULES} for name, t in tables.items()}
    off = {rule: sum(abs(r[rule]["coverage"] - 0.9) for r in runs.values()) / len(runs) for rule in accuracy.RULES}
    record = {"command": "python benchmarks/intervals.py " + " ".join(args.validations), "rules": list(accuracy.RULES),
              "validations": runs, "mean_distance_from_90": off}
    for name, r in runs.items():
        print(f"{name}: " + "; ".join(f"{rule} {100 * r[rule]['coverage']:.1f} % (width "
                                      f"{100 * r[rule]['width_median']:.1f} %)" for rule in accuracy.RULES))
    print("mean distance from 90 %: " + "; ".join(f"{rule} {100 * v:.1f} points" for rule, v in off.items()))
    if args.json:
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
