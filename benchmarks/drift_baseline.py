"""What the drift probe's baseline was, profile by profile: its one timing on the server, or the fit.

    python benchmarks/drift_baseline.py NAME=DIR ... [--json docs/results/drift_baseline.json]

DIR holds a black-box profile and its twin (profile.json, twin.yaml: `batchlab profile` or
benchmarks/twin.py writes them), and, where its validations ran, their kept directories under
DIR/CONDITION/validate. `validate` divides each reference burst it times by a baseline
(`validation.drift_against`): `profile`, the same burst timed once on the server at the end of its
profile (a median of three back to back), or `prediction`, the profile's replay of it on the fitted
steps. Per profile: both baselines and their ratio (how far the one timing stood from the fit the
whole profile made), the fit's RMS error beside it; per kept validation and workload: the median
of its timings against each. Nothing runs on a server: the replays are simulated.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from batchlab.calibrate.validate import REFERENCE, SERVER, Profile, drift_factors, load_profiles
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors


def validations(d: Path, prof: Profile) -> dict:
    """condition -> workload -> the median of its reference timings against either baseline, as
    `validate` reads them (drift_factors)."""
    out = {}
    for acc in sorted(d.glob("*/validate/accuracy.json")):
        per = {}
        for ref in sorted(acc.parent.glob("*/reference.csv")):
            drift = drift_factors(ref, {SERVER: prof}, [SERVER], against="profile")[SERVER]
            per[ref.parent.name] = {"median_s": drift.factor * prof.reference_s, "over_profile": drift.factor,
                                    "over_prediction": drift.vs_prediction}
        if per:
            out[acc.parent.parent.name] = per
    return out


def one(name: str, path: str) -> dict:
    d = Path(path)
    if not (d / "profile.json").is_file() or not (d / "twin.yaml").is_file():
        raise ConfigError(f"{name}: {d} holds no profile.json and twin.yaml (a profile's directory)")
    prof = load_profiles([], str(d / "twin.yaml"))[SERVER]
    if not prof.reference_s:
        raise ConfigError(f"{name}: {d}/profile.json has no timing of the reference burst (reference_burst_s)")
    predicted = prof.predicted_reference_s(SERVER)
    return {"dir": path, "fit_rms": prof.sigma, "timed_s": prof.reference_s, "predicted_s": predicted,
            "timed_over_predicted": prof.reference_s / predicted, "validations": validations(d, prof)}


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", metavar="NAME=DIR")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    specs = dict(d.split("=", 1) if "=" in d else (Path(d).name, d) for d in args.dirs)
    profiles = {name: one(name, path) for name, path in specs.items()}
    for name, p in profiles.items():
        print(f"{name}: timed {1e3 * p['timed_s']:.0f} ms, predicted {1e3 * p['predicted_s']:.0f} ms "
              f"({p['timed_over_predicted']:.2f}x; fit rms {100 * p['fit_rms']:.1f} %)")
    record = {"command": "python benchmarks/drift_baseline.py " + " ".join(args.dirs) + (
        f" --json {args.json}" if args.json else ""), "burst": dict(zip(("rows", "prompt", "new"), REFERENCE)),
        "profiles": profiles}
    if args.json:
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
