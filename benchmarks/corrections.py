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
no latency metric is one-sided (no sign in more than 75 % of cells) and the mean of its errors;
with --held-out, once over the others, once over the held-out ones and once over every one.
Where --json already holds a record whose intervals were built by another rule (accuracy.json's
`interval`), its coverage stays beside the new one.
--gates 0,2 judges each combination at each `validation.gate` (a correction applied only where it
lies more than that many standard errors from none); without it every combination is judged at
gate 0 (each correction applied as measured, so its whole effect shows), while `validate` itself
applies gate 2. --defaults-only judges only the combination `validate` applies by default (its
config's own defaults: by_default), at each gate. --se-units cells,workloads judges each at both counts of the
corrections' standard errors (`validation.se_units`: every cell independent, or every workload).
--set KEY=VALUE (repeatable) changes the config of every replay besides the combination. Every
other setting is the validation's own (its validate.yaml holds every field, so a re-judge
reproduces it): a default changed since it ran needs --set, e.g. `--set
validation.drift_against=prediction` for one that divided the drift probe's timings by the
burst's timing on the server when profiled.
Usage: python benchmarks/corrections.py NAME=DIR[@TWIN] ... [--gates 0,2] [--se-units cells,workloads]
       [--defaults-only] [--set KEY=VALUE ...] [--json FILE]
  DIR holds validate.yaml (the config the validation ran with); TWIN is the server's twin config
  where accuracy.json does not name it.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from batchlab.calibrate.accuracy import sides
from batchlab.calibrate.validate import INTERVAL, validate
from batchlab.core.config.run import ValidateConfig
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

SWITCHES = {"drift": (False, True), "live": (False, True), "first_token": ("off", "factor", "delay")}
METRICS = ("e2e_p50", "ttft_p50", "tpot_p50")
ONE_SIDED = 0.75          # a metric is one-sided when one sign holds in more than this share of cells
UNITS = ("cells", "workloads")
TUNING = ("gate", "se_units")   # how the corrections are applied, beside which of them are on


def by_default(on: dict) -> bool:
    """Whether a combination is the one `validate` applies by default (validation's own defaults;
    the drift probe counts as on only where it scales the replays, `apply`)."""
    v = ValidateConfig()
    return on == {"drift": v.drift_applied, "live": v.live, "first_token": v.first_token} | {
        k: on[k] for k in TUNING if k in on}


def every(on: dict) -> bool:
    """Whether a combination is every correction on as `validate` applies them by default (in a
    record made before the first-token delay, every switch true), at whatever gate."""
    return all(x in (True, "delay") for k, x in on.items() if k not in TUNING)


def label(on: dict) -> str:
    names = {"drift": "drift probe", "live": "live factor", "factor": "first-token factor", "delay": "first-token delay"}
    text = " + ".join(names[k if v is True else v] for k, v in on.items() if k in SWITCHES and v not in (False, "off"))
    tags = ([f"gate {on['gate']:g}"] if on.get("gate") else []) + (
        [f"standard errors over {on['se_units']}"] if "se_units" in on else [])
    return (text or "none") + (f" ({', '.join(tags)})" if tags else "")


def judge(src: Path, twin: str | None, on: dict[str, bool], scratch: Path, extra: tuple[str, ...] = ()) -> dict:
    """One combination on a scratch copy of the validation in `src` (with the config overrides in
    `extra` besides): per metric its median |error| and sign shares, the coverage."""
    where = scratch / re.sub(r"[^A-Za-z0-9.]+", "-", label(on)).strip("-")
    shutil.copytree(src, where, ignore=shutil.ignore_patterns("validation.*", "accuracy.json", "live_*"))
    overrides = [*extra, *(f"validation.{k}={str(v).lower()}" for k, v in on.items())]
    cfg = load_config(str(src / "validate.yaml"), overrides)
    acc = json.loads((src / "accuracy.json").read_text())
    profiles = [] if twin else [p["path"] for p in acc["profiles"].values()]
    v = validate(cfg, profiles, where, twin=twin)
    summ = v.summary.set_index("metric")
    signs = sides(v.cells)
    acc = json.loads((where / "accuracy.json").read_text())
    return {"on": on, "coverage": float(v.cells["inside"].mean()), "interval": acc["interval"],
            "live_profile": live_scales(acc),
            "by_workload": {w: {m: r[m]["median_error"] for m in METRICS if m in r} for w, r in acc.get("by_workload", {}).items()},
            "metrics": {m: {"error_median": float(summ.loc[m, "error_median"]), **signs[m]} for m in METRICS},
            "floor": {m: float(summ.loc[m, "noise_median"]) for m in METRICS}}


def live_scales(acc: dict) -> dict[str, float]:
    """level -> what the live profile this replay wrote multiplies the decode step by, read off the
    two files (the written profile and the one it was made from), not from the factors' record."""
    out = {}
    for level, rec in (acc.get("live") or {}).get("pooled", {}).items():
        written = json.loads(Path(rec["profile"]).read_text())
        source = json.loads(Path(written["live_factor"]["from"]).read_text())
        if source.get("decode_s_per_row"):
            out[level] = written["decode_s_per_row"] / source["decode_s_per_row"]
    return out


def checked(name: str, spec: str, extra: tuple[str, ...] = ()) -> tuple[Path, str | None]:
    """A NAME=DIR[@TWIN] argument's validation directory and twin config, refused before anything
    is replayed (a run of every argument takes minutes), as is an override in `extra` its config
    does not take."""
    path, _, twin = spec.partition("@")
    src = Path(path)
    if not (src / "validate.yaml").is_file() or not (src / "accuracy.json").is_file():
        raise ConfigError(f"{name}: {src} is not a finished validation (validate.yaml and accuracy.json)")
    if extra:
        load_config(str(src / "validate.yaml"), list(extra))
    acc = json.loads((src / "accuracy.json").read_text())
    if twin and not Path(twin).is_file():
        raise ConfigError(f"{name}: no twin config at {twin}")
    twin = twin or acc.get("twin")
    if twin is None and "server" in acc.get("profiles", {}):
        raise ConfigError(f"{name}: {src} validated a server: give its twin config as {name}={path}@TWIN")
    return src, twin


def combinations(gates: list[float], defaults_only: bool, units: list[str] | None = None) -> list[dict]:
    """Every switch setting (or only validate's default one) at each gate (and each count of the
    standard errors in `units`; none given: validate's own, unnamed in the labels)."""
    ons = [dict(zip(SWITCHES, bits)) for bits in itertools.product(*SWITCHES.values())]
    tunings = [{"gate": g} | ({"se_units": u} if units else {}) for g in gates for u in (units or [None])]
    return [on | t for t in tunings for on in ons if by_default(on) or not defaults_only]


def condition(name: str, spec: str, scratch: Path, combos: list[dict], extra: tuple[str, ...] = ()) -> dict:
    src, twin = checked(name, spec, extra)
    path = spec.partition("@")[0]
    runs = []
    for on in combos:
        runs.append(judge(src, twin, on, scratch / name, extra) | {"label": label(on)})
        print(f"{name}: {runs[-1]['label']}: " + ", ".join(
            f"{m} {100 * r['error_median']:.1f}% (below {100 * r['below']:.0f}%)" for m, r in runs[-1]["metrics"].items()),
            flush=True)
    return {"dir": path, "twin": twin, "cells": runs[0]["metrics"]["e2e_p50"]["cells"], "interval": runs[0]["interval"],
            "floor": runs[0].pop("floor"),
            "variants": [{k: v for k, v in r.items() if k not in ("floor", "interval")} for r in runs]}


# what built the intervals of a record whose rule does not name the model term's parts
FIRST_RULE = ("90 %: sim +- 1.645 sqrt(model^2 + run^2); model: step costs moved by the fit's error, the live factor's "
              "standard error and the reference bursts' spread")


def rule_of(text: str | None) -> str:
    return text if text and ("model:" in text or text in INTERVAL.values()) else FIRST_RULE


def earlier_intervals(path: Path, rule: str) -> list[dict]:
    """The coverage an earlier record at `path` measured under another interval rule (per directory,
    with every correction on), kept beside the new one: the same cells, judged by two rules."""
    if not path.is_file():
        return []
    old = json.loads(path.read_text())
    kept = old.get("earlier_intervals", [])
    old_rule = rule_of(next((c.get("interval") for c in old["conditions"].values()), None))
    if old_rule == rule:
        return kept
    coverage = {n: next(v["coverage"] for v in c["variants"] if every(v["on"])) for n, c in old["conditions"].items()}
    return [{"interval": old_rule, "command": old["command"], "coverage": coverage},
            *[e for e in kept if e["interval"] not in (old_rule, rule)]]   # one entry per rule: the latest


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


def tunings(gates_arg: str, units_arg: str) -> tuple[list[float], list[str]]:
    """--gates and --se-units as lists, refused with one line where a value is not one."""
    try:
        gates = [float(g) for g in gates_arg.split(",")]
    except ValueError:
        raise ConfigError(f"--gates: expected numbers separated by commas, got {gates_arg!r}") from None
    if any(not 0 <= g <= 10 for g in gates):
        raise ConfigError("--gates: each gate is between 0 and 10 standard errors")
    units = [u for u in units_arg.split(",") if u]
    if set(units) - set(UNITS):
        raise ConfigError(f"--se-units: expected {' or '.join(UNITS)} separated by commas, got {units_arg!r}")
    return gates, units


def overrides(pairs: list[str]) -> tuple[str, ...]:
    """--set values, refused with one line where one is not KEY=VALUE or sets what the combinations
    themselves vary."""
    for pair in pairs:
        key = pair.partition("=")[0]
        if "=" not in pair or not key:
            raise ConfigError(f"--set: expected KEY=VALUE, got {pair!r}")
        if key.removeprefix("validation.") in (*SWITCHES, *TUNING):
            raise ConfigError(f"--set {key}: set by the combinations themselves (--gates, --se-units)")
    return tuple(pairs)


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", metavar="NAME=DIR[@TWIN]")
    ap.add_argument("--held-out", default="", metavar="NAME,...",
                    help="directories summed apart: kept out of the choice of a default, to confirm it on")
    ap.add_argument("--json", default=None, help="write the figures here (e.g. docs/results/corrections.json)")
    ap.add_argument("--gates", default="0", metavar="K,...", help="validation.gate values to judge each combination at")
    ap.add_argument("--se-units", default="", metavar="U,...",
                    help="validation.se_units values (cells, workloads) to judge each combination at")
    ap.add_argument("--defaults-only", action="store_true", help="only the combination validate applies by default, at each gate")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="a config override for every replay besides the combination (repeatable)")
    args = ap.parse_args(argv)
    gates, units = tunings(args.gates, args.se_units)
    extra = overrides(args.overrides)
    specs = dict(d.split("=", 1) if "=" in d else (Path(d).name, d) for d in args.dirs)
    held = [h for h in args.held_out.split(",") if h]
    if set(held) - set(specs):
        raise ConfigError(f"--held-out: no directory named {', '.join(sorted(set(held) - set(specs)))}")
    for name, spec in specs.items():
        checked(name, spec, extra)
    with tempfile.TemporaryDirectory(prefix="corrections-") as tmp:
        combos = combinations(gates, args.defaults_only, units)
        conditions = {name: condition(name, spec, Path(tmp), combos, extra) for name, spec in specs.items()}
    record = {"command": "python benchmarks/corrections.py " + " ".join(args.dirs) + (
        f" --held-out {args.held_out}" if held else "") + (f" --gates {args.gates}" if args.gates != "0" else "") + (
        f" --se-units {args.se_units}" if units else "") + (" --defaults-only" if args.defaults_only else "") + "".join(
        f" --set {o}" for o in extra) + (f" --json {args.json}" if args.json else ""),
        "one_sided_above": ONE_SIDED, "conditions": conditions, "held_out": held, "set": list(extra),
        "summary": summary({n: c for n, c in conditions.items() if n not in held}),
        "summary_held_out": summary({n: c for n, c in conditions.items() if n in held}),
        "summary_all": summary(conditions) if held else []}
    if args.json:
        record["earlier_intervals"] = earlier_intervals(Path(args.json), rule_of(next(iter(conditions.values()))["interval"]))
    for part in ("summary", "summary_held_out", "summary_all"):
        for s in record[part]:
            print(f"{part}: {s['label']:<50} balanced in {s['balanced']} of {s['of']}, "
                  f"mean median error {100 * s['mean_error']:.1f}%")
    if args.json:
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
