"""One point, run again and again in one process: how far the machine is from itself, and does a
process slow down as it ages?

The tiny HF model of benchmarks/validate_sim.py (one torch thread), one seeded trace, the same
point run --runs times per strategy on one backend, the strategies alternating. Per run: p50
TPOT, TTFT and E2E, the Python objects alive, the peak RSS and the 1-minute load. Then per
strategy the spread of the same trace on the same machine (median, min and max over the median,
coefficient of variation), the trend (the later half's median over the earlier half's: state
carried from one point to the next would show as > 1), and, given --profiles, where the
calibrated simulator's replay of the trace falls among the real runs (no drift correction: the
profiles' own speed).
Usage: python benchmarks/same_point.py [--rate 6] [--runs 8] [--duration 10]
       [--profiles results/validate_sim] [--json docs/results/same_point.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import validate_sim  # noqa: E402  (the validation's own config: the same model and limits)

from batchlab.backends import make_backend  # noqa: E402
from batchlab.calibrate.validate import load_profiles, profile_for, sim_cost, sim_point  # noqa: E402
from batchlab.core.files import write_atomic  # noqa: E402
from batchlab.core.traffic import build_trace  # noqa: E402
from batchlab.run.config import load_config  # noqa: E402
from batchlab.run.point import run_point  # noqa: E402

METRICS = ("tpot_p50", "ttft_p50", "e2e_p50")


def spread(values: list[float]) -> dict:
    """Median, min and max over the median, the coefficient of variation, and the later half's
    median over the earlier half's."""
    med = statistics.median(values)
    half = len(values) // 2
    return {"median": med, "min_over_median": min(values) / med, "max_over_median": max(values) / med,
            "cv": statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0,
            "later_over_earlier": statistics.median(values[-half:]) / statistics.median(values[:half]) if half else 1.0}


def replayed(cfg, strategy: str, rate: float, profiles: str | None) -> dict | None:
    """The calibrated simulator's summary of the same trace (the profiles' own speed), or None."""
    if not profiles:
        return None
    found = load_profiles([str(p) for p in sorted(Path(profiles).glob("profile_*.json"))])
    prof = profile_for(strategy, found)
    return {m: sim_point(cfg, strategy, rate, 0, prof, sim_cost(cfg, prof.cost))[m] for m in METRICS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--strategies", default="dynamic,continuous")
    ap.add_argument("--profiles", default=None, help="a directory with profile_*.json (validate_sim's --out)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = os.getloadavg()
    strategies = args.strategies.split(",")
    tree = validate_sim.CONFIG | {"strategies": strategies}
    tree["traffic"] = tree["traffic"] | {"rates": [args.rate], "duration_s": args.duration}
    tree.pop("validation")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "same_point.yaml"
        path.write_text(yaml.safe_dump(tree, sort_keys=False))
        cfg = load_config(path)
    backend = make_backend(cfg)
    trace = build_trace(cfg.traffic, args.rate, 0)
    runs = []
    for i in range(args.runs):
        for strategy in strategies if i % 2 == 0 else strategies[::-1]:
            s = run_point(cfg, strategy, args.rate, 0, backend, trace).summary
            runs.append({"run": i, "strategy": strategy, **{m: s[m] for m in METRICS}, "objects": len(gc.get_objects()),
                         "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                         "load_1min": os.getloadavg()[0]})
            print(f"run {i} {strategy}: p50 TPOT {s['tpot_p50'] * 1e3:.2f} ms, p50 E2E {s['e2e_p50'] * 1e3:.0f} ms, "
                  f"objects {runs[-1]['objects']:,}, load {runs[-1]['load_1min']:.2f}", flush=True)
    per = {}
    for strategy in strategies:
        mine = [r for r in runs if r["strategy"] == strategy]
        per[strategy] = {m: spread([r[m] for r in mine]) for m in METRICS}
        sim = replayed(cfg, strategy, args.rate, args.profiles)
        if sim:
            for m in METRICS:
                real = [r[m] for r in mine]
                per[strategy][m] |= {"replayed": sim[m], "real_runs_above_replay": sum(x > sim[m] for x in real) / len(real)}
        print(strategy, json.dumps(per[strategy]))
    if args.json:
        record = {"command": "python benchmarks/same_point.py " + " ".join(sys.argv[1:]), "rate": args.rate,
                  "runs": args.runs, "duration_s": args.duration, "per_strategy": per, "run_rows": runs,
                  "objects_growth_per_run": (runs[-1]["objects"] - runs[0]["objects"]) / max(len(runs) - 1, 1),
                  "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "cpus": os.cpu_count()}
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
