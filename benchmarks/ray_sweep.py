"""A 48-point simulated sweep, `local` against a local Ray on this machine's CPUs, paired.

3 strategies x 8 rates x 2 repeats of the default simulator settings with `--duration` seconds of
traffic per point (~1 s of work per point here, so Ray's per-task overhead is not all that is
measured). Ray is started once and kept warm; the time ray.init takes is measured and reported
beside the sweep times, since a one-off `batchlab run --executor ray` pays it. Each repeat runs
both executors back to back (alternating which goes first) into fresh directories and checks
that requests.csv is byte-identical and summary.csv identical except wall_s (the one figure that
is not reproducible). Medians over repeats, the paired ratio local / ray per repeat.
Usage: python benchmarks/ray_sweep.py [--repeats 3] [--duration 600] [--cpus 2] [--json docs/results/ray_sweep.json]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

RATES = [4, 8, 12, 16, 20, 24, 28, 32]


def summary_records(path: Path) -> list[list[str]]:
    records = list(csv.reader(path.open(newline="")))
    at = records[0].index("wall_s")
    return [r[:at] + r[at + 1:] for r in records]


def point_seconds(path: Path) -> float:
    """Seconds the points themselves ran (summary.csv's wall_s, summed): with each worker on a core
    of its own this matches the local sum; more means the workers shared cores with other work."""
    return sum(float(r["wall_s"]) for r in csv.DictReader(path.open(newline="")))


def timed_sweep(overrides: list[str], out: Path) -> float:
    cfg = load_user_config(None, overrides)
    t = time.perf_counter()
    run_sweep(cfg, out)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=600.0, help="Seconds of simulated traffic per point.")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs the local Ray may use.")
    ap.add_argument("--json", default=None, help="Write the figures here (e.g. docs/results/ray_sweep.json).")
    args = ap.parse_args()
    import ray
    base = [f"traffic.rates={RATES}", "traffic.repeats=2", f"traffic.duration_s={args.duration:g}", "report=false"]
    points = 3 * len(RATES) * 2
    load_before = os.getloadavg()
    t = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    init_s = time.perf_counter() - t
    local_s, ray_s, identical, point_s, loads = [], [], [], {"local": [], "ray": []}, []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            order = ["local", "ray"] if rep % 2 == 0 else ["ray", "local"]
            times = {}
            for kind in order:
                times[kind] = timed_sweep(base + [f"executor.kind={kind}"], Path(tmp) / f"{kind}{rep}")
            a, b = Path(tmp) / f"local{rep}", Path(tmp) / f"ray{rep}"
            same = ((a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
                    and summary_records(a / "summary.csv") == summary_records(b / "summary.csv"))
            if not same:
                sys.exit(f"repeat {rep}: the Ray sweep's CSVs differ from the local one's")
            identical.append(same)
            for kind, path in (("local", a), ("ray", b)):
                point_s[kind].append(point_seconds(path / "summary.csv"))
            loads.append(os.getloadavg()[0])
            local_s.append(times["local"])
            ray_s.append(times["ray"])
            print(f"repeat {rep}: local {times['local']:.1f} s, ray {times['ray']:.1f} s, "
                  f"{times['local'] / times['ray']:.2f}x, CSVs identical; points ran {point_s['local'][-1]:.1f} s locally, "
                  f"{point_s['ray'][-1]:.1f} s on Ray; load {loads[-1]:.1f}", flush=True)
    ray.shutdown()
    ratios = [a / b for a, b in zip(local_s, ray_s)]
    with_init = [a / (b + init_s) for a, b in zip(local_s, ray_s)]
    out = {"command": "python benchmarks/ray_sweep.py " + shlex.join(sys.argv[1:]), "points": points,
           "strategies": 3, "rates": RATES, "repeats_per_sweep": 2, "duration_s": args.duration, "ray_cpus": args.cpus,
           "local_s": local_s, "ray_s": ray_s, "ratio_per_repeat": ratios, "ray_init_s": init_s,
           "ratio_with_init_per_repeat": with_init, "csvs_identical": all(identical),
           "point_wall_s_sum": point_s, "load_1min_after_each_repeat": loads,
           "ray_version": ray.__version__, "cpus": os.cpu_count(),
           "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}}
    print(f"median: local {statistics.median(local_s):.1f} s, ray {statistics.median(ray_s):.1f} s, "
          f"{statistics.median(ratios):.2f}x ({statistics.median(with_init):.2f}x counting ray.init's {init_s:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
