"""How fast does the simulator push requests through the *real* scheduler code?

1. Side by side, in one run: batchlab's continuous scheduler + driver + VirtualClock + simulated
   backend, against a reference toy simulator (its continuous mode), on the toy's own workload
   (5,000 requests) and cost constants (preset `toy`). Medians over repeats; the ratio is
   toy wall time / batchlab wall time (targets: >= 4, and >= 50,000 simulated
   requests per second of wall time).
2. An hour of traffic at 50 req/s with the default sweep's settings, continuous batching.

The toy is loaded from ../shared/seeds/toy-simulator.py.txt (or $BATCHLAB_TOY) and run as is.
Usage: python benchmarks/sim_speed.py [--repeats 5] [--skip-hour]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

from batchlab.backends.presets import load_cost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.core.clock import VirtualClock
from batchlab.core.limits import MAX_BATCH
from batchlab.core.request import Request
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_user_config
from batchlab.run.driver import Inbox, drive
from batchlab.run.point import run_point
from batchlab.schedulers import ContinuousConfig, ContinuousScheduler

ROOT = Path(__file__).resolve().parents[1]


def load_toy():
    path = Path(os.environ.get("BATCHLAB_TOY", ROOT.parent / "shared" / "seeds" / "toy-simulator.py.txt"))
    if not path.is_file():
        raise ConfigError(f"toy simulator not found at {path} (set BATCHLAB_TOY)")
    spec = importlib.util.spec_from_loader("toy", loader=None)
    toy = importlib.util.module_from_spec(spec)
    sys.modules["toy"] = toy               # its dataclasses look their module up
    exec(compile(path.read_text(), str(path), "exec"), toy.__dict__)
    return toy


def toy_run(toy, n: int, seed: int) -> tuple[float, float]:
    reqs = toy.make_workload(n, seed)
    t = time.perf_counter()
    end = toy.simulate_continuous(reqs, False)
    return time.perf_counter() - t, sum(r.generated for r in reqs) / end


def batchlab_run(toy, n: int, seed: int) -> tuple[float, float]:
    """The same workload through ContinuousScheduler with the toy's rules: KV booked for
    prompt + output at admission, no sequence or token cap, no chunking."""
    work = toy.make_workload(n, seed)
    reqs = [Request(f"r{i}", w.prompt_len, w.output_len,
                    w.arrived_at, index=i) for i, w in enumerate(work)]
    # NOTE: the largest caps a config accepts; the toy KV budget binds long before either
    cfg = ContinuousConfig(max_num_seqs=MAX_BATCH, max_num_batched_tokens=1 << 24, block_size=toy.KV_BLOCK_SIZE)
    sched = ContinuousScheduler(cfg, toy.KV_BLOCKS_AVAILABLE, policy="reserve")
    backend = SimulatedBackend(load_cost("toy"))
    clock = VirtualClock()
    t = time.perf_counter()
    clock.run(drive(sched, backend, clock, Inbox(reqs)))
    wall = time.perf_counter() - t
    end = max(r.completion_time for r in reqs)
    return wall, sum(r.output_len for r in reqs) / end


def hour_at_50(*overrides: str) -> tuple[float, int, dict]:
    cfg = load_user_config(None, ["traffic.duration_s=3600", "traffic.warmup_s=0", *overrides])
    res = run_point(cfg, "continuous", 50.0, 0, SimulatedBackend(load_cost(cfg.backend.preset)))
    return res.meta["wall_s"], len(res.requests), res.summary


@user_errors
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--skip-hour", action="store_true")
    ap.add_argument("--json", default=None, help="Write the figures (and how they were made) to this file.")
    args = ap.parse_args()
    load_before = os.getloadavg()
    toy = load_toy()
    toy_run(toy, 500, 7), batchlab_run(toy, 500, 7)              # warm-up
    toy_t, ours_t = [], []
    for _ in range(args.repeats):                                 # interleaved: same noise for both
        t, toy_thr = toy_run(toy, args.requests, 7)
        toy_t.append(t)
        t, our_thr = batchlab_run(toy, args.requests, 7)
        ours_t.append(t)
    toy_med, ours_med = statistics.median(toy_t), statistics.median(ours_t)
    print(f"toy workload: {args.requests} requests, toy constants, continuous batching, {args.repeats} repeats")
    print(f"  toy      : median {toy_med:.3f} s wall  ({args.requests / toy_med:,.0f} simulated req/s of wall time)"
          f"  simulated throughput {toy_thr:,.0f} tok/s")
    print(f"  batchlab : median {ours_med:.3f} s wall  ({args.requests / ours_med:,.0f} simulated req/s of wall time)"
          f"  simulated throughput {our_thr:,.0f} tok/s")
    print(f"  speed ratio batchlab/toy = {toy_med / ours_med:.2f} (target >= 4; "
          f"{args.requests / ours_med:,.0f} simulated req/s, target >= 50,000)")
    hours = {}
    if not args.skip_hour:
        for key, label, overrides in [("default", "default sweep settings", ()),
                                      ("long_outputs", "outputs of 32-256 tokens: past capacity, a prefill in almost every step",
                                       ("traffic.output_len={dist: uniform, low: 32, high: 256}",))]:
            wall, n, s = hour_at_50(*overrides)
            hours[key] = {"wall_s": wall, "requests": n, "throughput_tok_s": s["throughput_tok_s"]}
            print(f"one hour at 50 req/s, continuous, {label}: {n:,} requests in {wall:.1f} s wall "
                  f"(target < 60 s); simulated throughput {s['throughput_tok_s']:,.0f} tok/s")
    if args.json:
        out = {"command": f"python benchmarks/sim_speed.py --repeats {args.repeats} --json {args.json}",
               "requests": args.requests, "toy_wall_s": toy_t, "batchlab_wall_s": ours_t,
               "ratio_per_repeat": [a / b for a, b in zip(toy_t, ours_t)],
               "toy_throughput_tok_s": toy_thr, "batchlab_throughput_tok_s": our_thr, "hour_at_50": hours,
               "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "cpus": os.cpu_count()}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
