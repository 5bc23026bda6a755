"""Which corrections should `batchlab validate` apply? Every combination, re-judged on kept real runs.

`validate` can scale its replays by three measured corrections: the drift probe (the machine's
speed around the runs against the profile's, `validation.drift`), the live factor (real over
replayed p50 TPOT on the other workloads, `validation.live`) and the first-token factor (what p50
TTFT still misses on the other workloads, `validation.first_token`). Whether each helps depends on
the machine and the backend, and one validation shows one combination. This replays the real
points of kept validations (a `batchlab validate`, `benchmarks/validate_sim.py` or
`benchmarks/twin.py` directory) under all eight combinations, in scratch copies: no real run is
repeated, so every combination is judged on the very same cells.

Per directory and combination: the median |error| of p50 E2E, TTFT and TPOT, the share of cells
where the replay read below the real run (a one-sided error shows there), and the 90 % intervals'
coverage; the rerun floor beside them. The summary counts, per combination, the directories where
no latency metric is one-sided (no sign in more than 75 % of cells) and the mean of its errors.
Usage: python benchmarks/corrections.py NAME=DIR[@TWIN] ... [--json docs/results/corrections.json]
  DIR holds validate.yaml (the config the validation ran with); TWIN is the server's twin config
  where accuracy.json does not name it.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
from pathlib import Path

from batchlab.calibrate.accuracy import sides
from batchlab.calibrate.validate import validate
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

SWITCHES = ("drift", "live", "first_token")
METRICS = ("e2e_p50", "ttft_p50", "tpot_p50")
ONE_SIDED = 0.75          # a metric is one-sided when one sign holds in more than this share of cells


def label(on: dict[str, bool]) -> str:
    names = {"drift": "drift probe", "live": "live factor", "first_token": "first-token factor"}
    return " + ".join(names[k] for k in SWITCHES if on[k]) or "none"


def judge(src: Path, twin: str | None, on: dict[str, bool], scratch: Path) -> dict:
    """One combination on a scratch copy of the validation in `src`: per metric its median
    |error| and sign shares, the coverage."""
    where = scratch / label(on).replace(" + ", "_").replace(" ", "-")
    shutil.copytree(src, where, ignore=shutil.ignore_patterns("validation.*", "accuracy.json", "live_*"))
    overrides = [f"validation.{k}={str(v).lower()}" for k, v in on.items()]
    cfg = load_config(str(src / "validate.yaml"), overrides)
    acc = json.loads((src / "accuracy.json").read_text())
    profiles = [] if twin else [p["path"] for p in acc["profiles"].values()]
    v = validate(cfg, profiles, where, twin=twin)
    summ = v.summary.set_index("metric")
    signs = sides(v.cells)
    return {"on": on, "coverage": float(v.cells["inside"].mean()),
            "metrics": {m: {"error_median": float(summ.loc[m, "error_median"]), **signs[m]} for m in METRICS},
            "floor": {m: float(summ.loc[m, "noise_median"]) for m in METRICS}}


def condition(name: str, spec: str, scratch: Path) -> dict:
    path, _, twin = spec.partition("@")
    src = Path(path)
    if not (src / "validate.yaml").is_file() or not (src / "accuracy.json").is_file():
        raise ConfigError(f"{name}: {src} is not a finished validation (validate.yaml and accuracy.json)")
    acc = json.loads((src / "accuracy.json").read_text())
    twin = twin or acc.get("twin")
    if twin is None and "server" in acc.get("profiles", {}):
        raise ConfigError(f"{name}: {src} validated a server: give its twin config as {name}={path}@TWIN")
    runs = []
    for bits in itertools.product([False, True], repeat=len(SWITCHES)):
        on = dict(zip(SWITCHES, bits))
        runs.append(judge(src, twin, on, scratch / name) | {"label": label(on)})
        print(f"{name}: {runs[-1]['label']}: " + ", ".join(
            f"{m} {100 * r['error_median']:.1f}% (below {100 * r['below']:.0f}%)" for m, r in runs[-1]["metrics"].items()),
            flush=True)
    return {"dir": path, "twin": twin, "cells": runs[0]["metrics"]["e2e_p50"]["cells"],
            "floor": runs[0].pop("floor"), "variants": [{k: v for k, v in r.items() if k != "floor"} for r in runs]}


def summary(conditions: dict[str, dict]) -> list[dict]:
    """Per combination: in how many directories no metric is one-sided, and its mean median error."""
    out = []
    if not conditions:
        return out
    for i, first in enumerate(next(iter(conditions.values()))["variants"]):
        rows = [c["variants"][i] for c in conditions.values()]
        balanced = sum(all(max(m["below"], m["above"]) <= ONE_SIDED for m in r["metrics"].values()) for r in rows)
        errors = [m["error_median"] for r in rows for m in r["metrics"].values()]
        out.append({"label": first["label"], "balanced": balanced, "of": len(rows),
                    "mean_error": sum(errors) / len(errors)})
    return out


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", metavar="NAME=DIR[@TWIN]")
    ap.add_argument("--held-out", default="", metavar="NAME,...",
                    help="directories summed apart: kept out of the choice of a default, to confirm it on")
    ap.add_argument("--json", default=None, help="write the figures here (e.g. docs/results/corrections.json)")
    args = ap.parse_args(argv)
    specs = dict(d.split("=", 1) if "=" in d else (Path(d).name, d) for d in args.dirs)
    held = [h for h in args.held_out.split(",") if h]
    if set(held) - set(specs):
        raise ConfigError(f"--held-out: no directory named {', '.join(sorted(set(held) - set(specs)))}")
    with tempfile.TemporaryDirectory(prefix="corrections-") as tmp:
        conditions = {name: condition(name, spec, Path(tmp)) for name, spec in specs.items()}
    record = {"command": "python benchmarks/corrections.py " + " ".join(args.dirs) + (
        f" --held-out {args.held_out}" if held else "") + (f" --json {args.json}" if args.json else ""),
        "one_sided_above": ONE_SIDED, "conditions": conditions, "held_out": held,
        "summary": summary({n: c for n, c in conditions.items() if n not in held}),
        "summary_held_out": summary({n: c for n, c in conditions.items() if n in held})}
    for part in ("summary", "summary_held_out"):
        for s in record[part]:
            print(f"{part}: {s['label']:<50} balanced in {s['balanced']} of {s['of']}, "
                  f"mean median error {100 * s['mean_error']:.1f}%")
    if args.json:
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
