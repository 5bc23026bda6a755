"""What a prompt beside decoding rows costs a server, and what the prompt-token x row term earns.

A black-box profile sends each prefill probe's prompt beside 1, 4 and 16 streams decoding
together. This reads a saved profile's prefill samples and fits its samples twice: with every term,
and with the prompt-token x decode-row term (`mix_s_per_token_row`) held at zero. Per sample the
measured step and both fits' predictions; per stream count the median absolute relative error of
each fit; and, given the twin config the profile was written with (`--twin`), what one arrival
costs the twin's running streams (calibrate/twin_check.py arrival_cost: a short prompt, and a
long one) with each fit, to set beside what the server's request probe measured.
Nothing is sent to a server.
Usage: python benchmarks/beside_rows.py PROFILE [--twin TWIN] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import yaml

from batchlab.calibrate.fit import StepSample, fit_step_times
from batchlab.calibrate.profile import refit
from batchlab.calibrate.twin_check import LONG_ARRIVAL, Twin, arrival_cost
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

TERM = "mix_s_per_token_row"


def samples_of(profile: Path) -> list[StepSample]:
    try:
        rows = json.loads(profile.read_text())["samples"]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{profile}: not a measured profile (no step samples): {e}") from None
    fields = set(StepSample.__dataclass_fields__)
    samples = [StepSample(**{k: v for k, v in r.items() if k in fields}) for r in rows]
    if not any(s.kind == "prefill" and s.decode_rows > 1 for s in samples):
        raise ConfigError(f"{profile}: no prompt was probed beside more than one decoding stream "
                          "(profiled before `--streams`): nothing to compare")
    return samples


def compared(samples: list[StepSample]) -> dict:
    """Both fits, every prefill sample under each, and the errors by stream count."""
    fits = {"with": fit_step_times(samples), "without": fit_step_times(samples, (TERM,))}
    prefill = [s for s in samples if s.kind == "prefill"]
    pred = {k: f.predict(prefill) for k, f in fits.items()}
    rows = [{"streams": s.decode_rows, "prompts": s.admitted, "prompt_tokens": s.prefill_tokens,
             "streams_context": s.context_tokens - s.prefill_tokens, "measured_s": s.seconds,
             **{f"{k}_s": float(pred[k][i]) for k in fits}} for i, s in enumerate(prefill)]
    errors = {}
    for b in sorted({r["streams"] for r in rows}):
        part = [r for r in rows if r["streams"] == b]
        errors[str(int(b))] = {k: statistics.median(abs(r[f"{k}_s"] / r["measured_s"] - 1) for r in part) for k in fits}
    return {"fits": {k: {"coefficients": f.coefficients} | f.summary() for k, f in fits.items()},
            "prefill": rows, "prefill_error_by_streams": errors}


def twin_costs(profile: Path, twin: Path) -> dict:
    """One arrival's cost to the twin's running streams (short and long prompt), with each fit."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, without in (("with", ()), ("without", (TERM,))):
            fitted = Path(tmp) / f"{name}.json"
            refit(profile, fitted, without)
            tree = yaml.safe_load(twin.read_text())
            tree["backend"]["profile"] = str(fitted)
            cfg_path = Path(tmp) / f"{name}.yaml"
            cfg_path.write_text(yaml.safe_dump(tree))
            run = Twin(load_config(cfg_path)).replay
            out[name] = arrival_cost(run) | arrival_cost(run, 1, LONG_ARRIVAL, "long_")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--twin", type=Path, help="the twin config written with the profile: arrival costs on it")
    ap.add_argument("--json", type=Path, help="where the figures go")
    a = ap.parse_args(argv)
    if a.twin is not None and not a.twin.is_file():
        raise ConfigError(f"--twin {a.twin}: file not found")
    out = {"profile": str(a.profile), "command": "python benchmarks/beside_rows.py " + " ".join(argv or sys.argv[1:])}
    out |= compared(samples_of(a.profile))
    if a.twin is not None:
        out["twin"] = str(a.twin)
        out["arrival_costs"] = twin_costs(a.profile, a.twin)
    for b, e in out["prefill_error_by_streams"].items():
        print(f"beside {b} stream(s): prefill step error {100 * e['with']:.1f} % with the term, "
              f"{100 * e['without']:.1f} % without")
    print(f"{TERM}: {1e9 * out['fits']['with']['coefficients'][TERM]:.1f} ns per prompt token and decode row")
    for k, c in out.get("arrival_costs", {}).items():
        print(f"twin {k} the term: an arrival costs the streams {1e3 * c['arrival_s']:.2f} ms, "
              f"a {LONG_ARRIVAL[0]}-token prompt {1e3 * c['long_arrival_s']:.2f} ms")
    if a.json:
        write_atomic(a.json, json.dumps(out, indent=2, default=lambda o: asdict(o)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(user_errors(main)())
