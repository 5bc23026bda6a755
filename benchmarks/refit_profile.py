"""Refit a kept black-box profile with its prompt-pass samples grouped as `batchlab profile` now groups them.

A server's profile (calibrate/blackbox.py) times a prompt sent beside a decoding stream once per
pass over the grid. It used to keep one sample per (rows, prompt, stream context), and the
stream's context at the probe moves by a few tokens from pass to pass, so each sample was a
single timing: one slow step set the prompt terms. It now keeps one per (rows, prompt), the
median over the passes. This applies that to a profile written before, from the samples it
recorded, and refits the step-time model (calibrate/fit.py) on them: no server is needed, so a
kept validation can be judged again on the refitted profile (benchmarks/corrections.py with
DIR@TWIN, TWIN a copy of the twin config naming the new profile). The front end is kept as it
was (the idle probes behind it are not in the profile), unless --front-end says how to charge
the profile's two readings of it: `idle` (the idle reading as the front end, no delay beyond
it), `beside` (the reading beside a stream as the front end) or `split` (the idle reading as the
front end, what the beside reading holds beyond it as a delay off the engine: what `batchlab
profile` writes now, calibrate/twin.py front_end_parts).
Usage: python benchmarks/refit_profile.py PROFILE --out NEW_PROFILE [--twin TWIN --twin-out NEW_TWIN]
       [--front-end idle|beside|split]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import yaml

from batchlab.backends.cost import COEFFS
from batchlab.calibrate.fit import StepSample, fit_step_times, samples_from
from batchlab.calibrate.twin import front_end_parts
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors


def grouped(rows: list[dict]) -> list[StepSample]:
    """The decode samples as they are; the prompt-pass ones, one per (admitted, prompt tokens): the
    median seconds, at the median context."""
    out = samples_from(r for r in rows if r["kind"] != "prefill")
    groups: dict[tuple[float, float], list[dict]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "prefill":
            groups[(r["admitted"], r["prefill_tokens"])].append(r)
    for v in groups.values():
        first = v[0]
        out.append(StepSample(statistics.median(r["context_tokens"] for r in v), first["prefill_tokens"],
                              first["decode_rows"], statistics.median(r["seconds"] for r in v), "prefill",
                              first["attn_pairs"], first["admitted"], first.get("warm", 0.0)))
    return out


def front_end(record: dict, how: str) -> dict:
    """The record's front end and the delay beyond it, charged as `how` says (see the module's doc)."""
    idle, beside = float(record.get("frontend_idle_s", record["frontend_s"])), record.get("frontend_beside_s")
    if beside is None:
        raise ConfigError("--front-end: this profile has no reading beside a stream (frontend_beside_s): "
                          "profile the server again")
    if how == "beside":
        return {"frontend_s": float(beside), "first_token_s": 0.0}
    front, beyond = front_end_parts(idle, float(beside)) if how == "split" else (idle, 0.0)
    return {"frontend_s": front, "first_token_s": beyond}


def refit(record: dict) -> dict:
    """The profile record with its samples grouped and its step-time terms refitted."""
    samples = grouped(record["samples"])
    fit = fit_step_times(samples)
    pred = fit.predict(samples)
    return record | fit.coefficients | {"shape_s": [list(k) for k in fit.shape]} | fit.summary() | {
        "samples": [asdict(s) | {"fit_seconds": float(p)} for s, p in zip(samples, pred)],
        "refitted_from": {"samples": len(record["samples"]), **{k: record.get(k) for k in COEFFS}}}


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--out", required=True, help="where the refitted profile goes")
    ap.add_argument("--twin", default=None, help="a twin config naming PROFILE: written to --twin-out naming --out")
    ap.add_argument("--twin-out", default=None)
    ap.add_argument("--front-end", choices=["idle", "beside", "split"], default=None,
                    help="how the twin charges the profile's two front-end readings (default: as the profile has them)")
    args = ap.parse_args(argv)
    if bool(args.twin) != bool(args.twin_out):
        raise ConfigError("--twin and --twin-out go together")
    src = Path(args.profile)
    if not src.is_file():
        raise ConfigError(f"{src}: no such profile")
    record = json.loads(src.read_text())
    if not any(r.get("kind") == "prefill" for r in record.get("samples", [])):
        raise ConfigError(f"{src}: no prompt-pass samples to group (not a server's black-box profile)")
    new = refit(record) | (front_end(record, args.front_end) if args.front_end else {})
    write_atomic(Path(args.out), json.dumps(new, indent=2) + "\n")
    print(f"{src}: {len(record['samples'])} samples -> {len(new['samples'])}; fit rms error "
          f"{100 * record['fit_rms_rel_error']:.1f}% -> {100 * new['fit_rms_rel_error']:.1f}%; "
          + ", ".join(f"{k} {record[k]:.3g} -> {new[k]:.3g}" for k in COEFFS if record.get(k) or new.get(k)))
    if args.twin:
        tree = yaml.safe_load(Path(args.twin).read_text())
        tree["backend"]["profile"] = str(Path(args.out).resolve())
        write_atomic(Path(args.twin_out), yaml.safe_dump(tree, sort_keys=False))


if __name__ == "__main__":
    sys.exit(main())
