"""`batchlab size` on a back-of-the-envelope sizing and on a GPU catalog search over an hour of traffic, timed.

1. configs/size-linear.yaml with --slo tpot_p95=60ms: a linear step model (25 ms + 0.4 ms
   per sequence) at 40 req/s of 200-token answers; what it picks and why one replica fewer fails.
2. configs/size-llama3-70b.yaml: Llama-3-70B on every catalog GPU at TP 1, 2, 4 and 8, an hour of
   bursty traffic, searched here (one process) and on a local Ray with this machine's CPUs,
   back to back; wall time of each whole command (Ray's start included), the settings searched,
   judged and simulated, and whether both picked the same setting.
Usage: python benchmarks/size_search.py [--json docs/results/size_search.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINEAR = ["configs/size-linear.yaml", "--slo", "tpot_p95=60ms"]
CATALOG = ["configs/size-llama3-70b.yaml"]


def size(args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "batchlab.cli", "size", *args, "--out", str(out)]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        sys.exit(f"{shlex.join(cmd)} failed:\n{res.stdout}\n{res.stderr}")
    data = json.loads((out / "size.json").read_text())
    return {"command": "batchlab size " + shlex.join(args), "wall_s": wall, "load_1min_after": os.getloadavg()[0],
            "output": res.stdout.splitlines(), **{k: data[k] for k in ("space", "judged", "simulated", "pick",
                                                                        "cheaper_failing", "closest_miss", "traffic",
                                                                        "slos")},
            "fewer": [s for s in data["settings"] if data["pick"] and s["device"] == data["pick"]["device"]
                      and s["replicas"] == data["pick"]["replicas"] - 1 and s["cap"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        linear = size(LINEAR, tmp / "linear")
        local = size(CATALOG, tmp / "local")
        ray = size(CATALOG + ["--executor", "ray"], tmp / "ray")
    for name, r in (("linear", linear), ("catalog, local", local), ("catalog, ray", ray)):
        print(f"{name}: {r['wall_s']:.1f} s, {r['judged']} judged ({r['simulated']} simulated) of {r['space']:,}; "
              f"pick {r['pick']['replicas']} x {r['pick']['device']} cap {r['pick']['cap']}")
    record = {"command": "python " + shlex.join(sys.argv), "cpus": os.cpu_count(),
              "load_avg_1_5_15": {"before": before, "after": os.getloadavg()}, "linear": linear, "local": local, "ray": ray,
              "same_pick": local["pick"] == ray["pick"]}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
