"""Dynamic vs naive batching on a real Hugging Face model: its two headline ratios.

One model load, one trace per rate, both strategies on the same trace (run alternately, so
drift in a shared machine's speed hits both): at the config's lowest rate, naive p50 TTFT /
dynamic p50 TTFT (target >= 5: naive waits for a full batch, dynamic launches on a timer); at
its highest rate, dynamic throughput / naive throughput (target >= 1). Medians over repeats,
with the per-repeat values and the machine's load beside them. The throughput ratio only means
something past naive batching's capacity (below it both serve what is offered): the report says
what share of the offered requests naive served there.
Usage: python benchmarks/hf_dynamic_vs_naive.py [--config configs/smoke.yaml] [--repeats 1]
       [--set traffic.rates=[2,100] ...] [--json docs/results/hf_dynamic_vs_naive.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

from batchlab.backends import make_backend
from batchlab.core.sustain import sustains
from batchlab.core.traffic import build_trace
from batchlab.run.config import load_config
from batchlab.run.point import run_point

TTFT_TARGET = 5.0        # naive p50 TTFT / dynamic p50 TTFT at the lowest rate
THROUGHPUT_TARGET = 1.0  # dynamic throughput / naive throughput at the highest rate


def measure(cfg, backend, rate: float, repeat: int) -> dict[str, dict]:
    """Both strategies on one trace; order alternates with the repeat."""
    trace = build_trace(cfg.traffic, rate, repeat)
    order = ["naive", "dynamic"] if repeat % 2 == 0 else ["dynamic", "naive"]
    out = {}
    for strategy in order:
        res = run_point(cfg, strategy, rate, repeat, backend, trace)
        failed = res.summary["failed"]
        if failed:
            raise SystemExit(f"{strategy} @ {rate:g} req/s: {failed} requests failed")
        out[strategy] = res.summary
        print(f"  {strategy:8s} @ {rate:5g} req/s: {len(trace):4d} requests, "
              f"p50 TTFT {res.summary['ttft_p50']:.3f} s, throughput "
              f"{res.summary['throughput_tok_s']:.0f} tok/s, wall {res.meta['wall_s']:.1f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/smoke.yaml")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", default=None, help="Write the figures (and how they were made) to this file.")
    args = ap.parse_args()
    load_before = os.getloadavg()
    cfg = load_config(args.config, args.overrides)
    low, high = min(cfg.traffic.rates), max(cfg.traffic.rates)
    backend = make_backend(cfg)
    setup = backend.describe()
    print(f"model {setup.get('model')} on {setup.get('device')} ({setup.get('dtype')}); "
          f"naive.batch_size={cfg.naive.batch_size}, dynamic.max_batch_size={cfg.dynamic.max_batch_size}, "
          f"dynamic.max_wait_ms={cfg.dynamic.max_wait_ms:g}; {cfg.traffic.duration_s:g} s of traffic per point")
    t0 = time.perf_counter()
    ttft, thr, served = [], [], []
    for rep in range(args.repeats):
        lo = measure(cfg, backend, low, rep)
        hi = measure(cfg, backend, high, rep)
        ttft.append(lo["naive"]["ttft_p50"] / lo["dynamic"]["ttft_p50"])
        thr.append(hi["dynamic"]["throughput_tok_s"] / hi["naive"]["throughput_tok_s"])
        served.append({s: hi[s]["requests_per_s"] / high for s in ("naive", "dynamic")})
    wall = time.perf_counter() - t0
    report(low, high, ttft, thr, served, wall)
    if args.json:
        out = {"command": "python benchmarks/hf_dynamic_vs_naive.py " + " ".join(
                   [f"--config {args.config}", f"--repeats {args.repeats}", *[f"--set {o}" for o in args.overrides]]),
               "setup": {k: setup.get(k) for k in ("model", "device", "dtype", "torch_threads")},
               "low_rate": low, "high_rate": high, "ttft_ratio_per_repeat": ttft, "throughput_ratio_per_repeat": thr,
               "served_share_at_high_rate_per_repeat": served, "wall_s": wall,
               "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "cpus": os.cpu_count()}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


def report(low: float, high: float, ttft: list[float], thr: list[float], served: list[dict], wall: float) -> None:
    t, h = statistics.median(ttft), statistics.median(thr)
    verdict = lambda ok: "meets" if ok else "MISSES"  # noqa: E731
    print(f"p50 TTFT at {low:g} req/s: naive / dynamic = {t:.1f}x "
          f"({verdict(t >= TTFT_TARGET)} target >= {TTFT_TARGET:g}x; per repeat {[round(x, 1) for x in ttft]})")
    print(f"throughput at {high:g} req/s: dynamic / naive = {h:.2f}x "
          f"({verdict(h >= THROUGHPUT_TARGET)} target >= {THROUGHPUT_TARGET:g}x; per repeat {[round(x, 2) for x in thr]})")
    naive = statistics.median(s["naive"] for s in served)
    print(f"at {high:g} req/s naive served {100 * naive:.0f}% of the offered requests (median): "
          + ("past its capacity, so the ratio is a capacity ratio" if not sustains(math.nan, naive, False) else
             "NOT past its capacity: both serve what is offered, so the ratio says little"))
    print(f"benchmark wall time {wall:.0f} s")


if __name__ == "__main__":
    main()
