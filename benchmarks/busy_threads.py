"""One torch thread or two for `generate()` at batch 1, on a quiet machine and beside a background
job: does a second intra-op thread still pay off when other processes take part of every core?

Each sample is a fresh process (the tiny model in float32 on the CPU, `backend.threads` 1 or 2,
one warm-up batch): --batches batches of one request (32-token prompt, 64 new tokens) through
HFBackend.run_batch; the sample is their median tokens per second. Busy: a background job
burning --duty of each of the machine's cores (baselines/background.py) while the sample runs.
Thread counts alternate within each condition (1, 2; 2, 1; ...), --repeats samples each; reported
per condition: each count's median, and two over one as the median of the paired ratios.
Usage: python benchmarks/busy_threads.py [--repeats 3] [--batches 5] [--duty 0.4] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = """
import statistics, sys
from batchlab.backends.hf import HFOptions
from batchlab.backends.hf_backend import HFBackend
from batchlab.core.clock import RealClock
from batchlab.core.traffic import TraceItem, make_requests
threads, batches = int(sys.argv[1]), int(sys.argv[2])
hf = HFBackend(HFOptions(model="tiny", device="cpu", dtype="float32", warmup_batches=1, threads=threads),
               warmup_shape=(1, 32, 8))
clock = RealClock()
async def main():
    await hf.start(clock)
    rates = []
    for _ in range(batches):
        reqs = make_requests([TraceItem(0.0, 32, 64)], clock.now(), hf.prepare)
        t0 = clock.now()
        await hf.run_batch(reqs, clock)
        rates.append(64 / (clock.now() - t0))
    return statistics.median(rates)
print(clock.run(main()))
"""


def sample(threads: int, batches: int) -> float:
    res = subprocess.run([sys.executable, "-c", SAMPLE, str(threads), str(batches)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return float(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from batchlab.baselines.background import background_load
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--duty", type=float, default=0.4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    load_before, cores = os.getloadavg(), list(range(os.cpu_count() or 1))
    conditions = {}
    for cond in ("quiet", "busy"):
        runs = {1: [], 2: []}
        for k in range(args.repeats):
            for threads in ((1, 2) if k % 2 == 0 else (2, 1)):
                if cond == "busy":
                    with background_load(cores, args.duty):
                        runs[threads].append(sample(threads, args.batches))
                else:
                    runs[threads].append(sample(threads, args.batches))
                print(f"{cond} repeat {k}: {threads} thread(s) {runs[threads][-1]:.0f} tok/s", flush=True)
        ratios = [b / a for a, b in zip(runs[1], runs[2])]
        conditions[cond] = {"tok_s": {str(t): statistics.median(v) for t, v in runs.items()},
                            "tok_s_per_repeat": {str(t): v for t, v in runs.items()},
                            "two_over_one": statistics.median(ratios), "two_over_one_per_repeat": ratios}
    record = {"command": "python benchmarks/busy_threads.py" + f" --repeats {args.repeats} --batches {args.batches}"
              + f" --duty {args.duty:g}" + (f" --json {args.json}" if args.json else ""),
              "duty": args.duty, "cpus": os.cpu_count(),
              "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "conditions": conditions}
    for cond, c in conditions.items():
        print(f"{cond}: 1 thread {c['tok_s']['1']:.0f} tok/s, 2 threads {c['tok_s']['2']:.0f}, "
              f"two / one {c['two_over_one']:.2f}x")
    if args.json:
        from batchlab.core.files import write_atomic
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
