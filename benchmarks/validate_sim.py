"""Can the simulator stand in for this machine? Profile the tiny HF model, then validate on held-out traffic.

1. `batchlab profile` the tiny model twice: request-level (`generate()`, used by naive/dynamic)
   and iteration-level (our step engine, used by continuous). Closed bursts over a grid of batch
   sizes x contexts and prompt lengths; no Poisson traffic, so every validation cell is unseen.
2. `batchlab validate` on three workloads the profiles never saw: `base` (prompts and outputs
   16-64 tokens, Poisson), `long-prompts` (prompts 96-320, outputs 8-32) and `bursty` (base lengths,
   gamma arrivals with shape 0.25: the same mean rate in clumps), at three rates each; every point
   runs twice on the real model (the noise floor), once on the simulator and twice more with the
   step costs moved by the fit's error (the interval); a burst per strategy judges saturated throughput.
Targets: median |E2E error| <= 6 %, P90 <= 10 %; p50 TTFT and TPOT median <= 10 %; or
within 1.5x the measured noise floor; 90 % intervals covering 85-95 % of cells.
Each step runs the CLI exactly as printed, so the figures can be reproduced by hand.
Usage: python benchmarks/validate_sim.py [--out results/validate_sim] [--rates 3,6,10] [--duration 10]
       [--json docs/results/validate_sim.json] [--skip-profile] [--seed 7]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from batchlab.baselines.background import background_load
from batchlab.calibrate.accuracy import sides
from batchlab.core.files import write_atomic

CONFIG = {
    "name": "validate-tiny-cpu",
    "backend": {"kind": "hf", "model": "tiny", "device": "cpu", "dtype": "float32",
                "memory_budget_bytes": 268435456, "warmup_batches": 2},
    "naive": {"batch_size": 8},
    "dynamic": {"max_batch_size": 32, "max_wait_ms": 50},
    "continuous": {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "block_size": 16},
    "traffic": {"arrival": "poisson", "warmup_s": 3, "seed": 7, "repeats": 1,
                "prompt_len": {"dist": "uniform", "low": 16, "high": 64},
                "output_len": {"dist": "uniform", "low": 16, "high": 64}},
    "validation": {"workloads": {
        "long-prompts": {"prompt_len": {"dist": "uniform", "low": 96, "high": 320},
                         "output_len": {"dist": "uniform", "low": 8, "high": 32}},
        "bursty": {"arrival": "gamma", "burstiness": 0.25}}},
    "report": False,
}

def sh(cmd: list[str], env: dict[str, str]) -> None:
    """Run one CLI step, printing it exactly, and the machine's load around it (a shared machine:
    other processes' load is the main source of error here, so it is shown, not hidden)."""
    pre = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"$ {pre} " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    before = os.getloadavg()[0]
    subprocess.run(cmd, check=True, env=os.environ | env)
    print(f"  (1-min load average: {before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores)")


# What each later term of the step model earns: the same real runs, the profiles refitted with the
# term held at zero; "five-term model" is the model without any of the three.
VARIANTS = {"without attention": "attn_s_per_pair", "without admission": "admit_s", "without warm-up": "warmup_s",
            "without the shape correction": "shape_s", "five-term model": "attn_s_per_pair,admit_s,warmup_s,shape_s"}
# The corrections the replays get, each switched from its default (the drift probe is recorded, not
# applied, by default): the same profiles, validated with
# these config keys (every combination of the three: benchmarks/corrections.py)
SWITCHES = {"without the first-token factor": "no-first-token", "without the live factor": "no-live",
            "with the drift probe applied": "drift"}
SETTINGS = {"no-first-token": ["validation.first_token=false"], "no-live": ["validation.live=false"],
            "drift": ["validation.drift=apply"]}


def ablate(bl: list[str], config: Path, out: Path, strategies: list[str], env: dict[str, str]) -> dict:
    """Per variant, per metric: median and P90 |error| over the same held-out cells. The real runs
    are copied, so `validate` resumes them (nothing real runs again) and only the replays change."""
    import shutil
    result = {}
    for name, without in list(VARIANTS.items()) + list(SWITCHES.items()):
        tag = without.replace(",", "+")
        vdir = out / "ablation" / tag
        if vdir.exists():
            shutil.rmtree(vdir)
        for w in (out / "validate").iterdir():
            if w.is_dir():
                for part in ("real", "rerun"):
                    if (w / part).is_dir():
                        shutil.copytree(w / part, vdir / w.name / part)
                for kept in ("saturation.csv", "reference.csv"):     # real measurements: every variant reads the same
                    if (w / kept).is_file():
                        shutil.copy(w / kept, vdir / w.name / kept)
        profiles = []
        for strategy in dict.fromkeys("continuous" if s == "continuous" else "dynamic" for s in strategies):
            dst = vdir / f"profile_{strategy}.json"
            if without not in SETTINGS:
                sh(bl + ["profile", "--refit", str(out / f"profile_{strategy}.json"), "--without", without, "--out", str(dst)], env)
            else:
                shutil.copy(out / f"profile_{strategy}.json", dst)
            profiles += ["--profile", str(dst)]
        sets = [a for kv in SETTINGS.get(without, []) for a in ("--set", kv)]
        sh(bl + ["validate", str(config), *profiles, "--out", str(vdir)] + sets, env)
        metrics = json.loads((vdir / "accuracy.json").read_text())["metrics"]
        below = sides(pd.read_csv(vdir / "validation.csv"))
        result[name] = {m["metric"]: {"error_median": m["error_median"], "error_p90": m["error_p90"],
                                      "coverage": m["coverage"]} | below.get(m["metric"], {}) for m in metrics}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/validate_sim")
    ap.add_argument("--rates", default="3,6,10", help="req/s, comma-separated (the profile never sees these)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of traffic per point after warm-up")
    ap.add_argument("--strategies", default="dynamic,continuous")
    ap.add_argument("--repeats", type=int, default=5, help="profile passes over the grid (medians)")
    ap.add_argument("--seed", type=int, default=CONFIG["traffic"]["seed"],
                    help="traffic seed: another gives every workload new traces (a validation on fresh cells)")
    ap.add_argument("--traffic-repeats", type=int, default=1, help="traces per rate (each run twice for the noise floor)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (OMP_NUM_THREADS); 1 keeps a shared machine's interference proportional")
    ap.add_argument("--new-tokens", type=int, default=40,
                    help="profile burst length: the traffic's mean output (generate() speeds up over its first steps)")
    ap.add_argument("--gap-ms", type=float, default=200.0, help="profile: idle time before each burst (live requests often find the backend idle)")
    ap.add_argument("--skip-profile", action="store_true", help="reuse the profiles already in --out")
    ap.add_argument("--no-ablation", action="store_true",
                    help="skip refitting without each later term (replays of the same real runs: seconds)")
    ap.add_argument("--json", default=None, help="Write the errors (and how they were made) to this file.")
    ap.add_argument("--busy", type=float, default=None, metavar="DUTY",
                    help="run the validation (not the profile) beside a background load burning DUTY of every core")
    args = ap.parse_args()
    load_before = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    strategies = args.strategies.split(",")
    config = write_config(args, out, strategies)
    bl = [sys.executable, "-m", "batchlab.cli"]
    env = {"OMP_NUM_THREADS": str(args.threads)}
    profiles = profile_all(args, bl, config, out, strategies, env)
    with contextlib.ExitStack() as stack:
        busy = stack.enter_context(background_load(list(range(os.cpu_count() or 1)), args.busy)) if args.busy else None
        sh(bl + ["validate", str(config), *profiles, "--out", str(out / "validate")], env)
    ablation = {} if args.no_ablation else ablate(bl, config, out, strategies, env)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        record = result(args, out, ablation, load_before) | {"background": busy and {k: v for k, v in busy.items() if k != "pids"}}
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")
    return 0


def write_config(args, out: Path, strategies: list[str]) -> Path:
    """The run config every step reads: CONFIG with the flags' rates, duration and strategies."""
    cfg = CONFIG | {"strategies": strategies, "out": str(out / "run")}
    cfg["traffic"] = CONFIG["traffic"] | {"rates": [float(r) for r in args.rates.split(",")],
                                          "duration_s": args.duration, "repeats": args.traffic_repeats,
                                          "seed": args.seed}
    config = out / "validate.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return config


def profile_all(args, bl: list[str], config: Path, out: Path, strategies: list[str], env: dict[str, str]) -> list[str]:
    """One profile per level the strategies run at (request-level `dynamic`, iteration-level
    `continuous`): measured, or with --skip-profile the kept one refitted; their --profile flags."""
    profiles = []
    for strategy in dict.fromkeys("continuous" if s == "continuous" else "dynamic" for s in strategies):
        path = out / f"profile_{strategy}.json"
        profiles += ["--profile", str(path)]
        if not args.skip_profile:
            sh(bl + ["profile", str(config), "--strategy", strategy, "--batch-sizes", "1,2,4,8,16,32",
                     "--contexts", "16,48,96,192", "--prompts", "16,32,64,128,320", "--new-tokens", str(args.new_tokens),
                     "--repeats", str(args.repeats), "--gap-ms", str(args.gap_ms), "--out", str(path)], env)
        else:   # a kept profile may predate the later terms: fit its samples with the whole model
            sh(bl + ["profile", "--refit", str(path), "--out", str(path)], env)
    return profiles


def result(args, out: Path, ablation: dict, load_before) -> dict:
    """The result file: the errors per metric, every cell, the ablation, and how they were made."""
    acc = json.loads((out / "validate" / "accuracy.json").read_text())
    cells = pd.read_csv(out / "validate" / "validation.csv")
    return {"command": "python benchmarks/validate_sim.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "rates": args.rates, "duration_s": args.duration, "traffic_repeats": args.traffic_repeats,
            "threads": args.threads, "workloads": acc["workloads"], "profiles": acc["profiles"],
            "metrics": acc["metrics"], "coverage": float(cells["inside"].mean()), "cells": len(cells), "signs": sides(cells),
            "ablation": ablation, "drift": acc["drift"], "live": acc.get("live", {}), "uncorrected": acc["uncorrected"],
            "load_1min_at_reference_bursts": acc.get("load_1min", {}),
            "cell_rows": cells.drop(columns=["kind"]).to_dict(orient="records"),
            "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "cpus": os.cpu_count()}


if __name__ == "__main__":
    sys.exit(main())
