"""Four batching modes on one workload, on the simulator's `toy` step model: one request at a time,
padded static batches of 16, continuous batching, and continuous batching with 512-token chunked
prefill.

The workload: Poisson arrivals at 40 req/s; prompts of 128, 256, 512, 2,048 or 8,192 tokens (equally
likely), answers of 50-300 tokens (uniform); written as a trace file and replayed by every mode.
The step model is one for all four (the toy preset: 0.2 ms per step, 0.04 ms per prompt token,
0.5 ms per decode row, 1,800 KV blocks of 16 tokens), so the modes differ only in how they batch.
Continuous batching books a request's whole KV at admission (`preemption: reserve`); the two
continuous modes are run again with preemption by recomputation, which takes blocks as tokens are
computed and evicts when they run out.
Reported per mode: output tokens/s, mean TTFT, p99 inter-token latency and requests finished;
then chunked prefill against whole-prompt prefill (the last two modes).
`--backend tiny` runs the same modes on the tiny model (CPU, real time, one torch thread): padded
`generate()` for the first two, our step engine for the continuous ones. Its context is 4,096
tokens, so prompts and the KV cache are a quarter of the toy's (32 to 2,048 tokens; 450 blocks of
16 tokens), chunks stay 512 tokens and answers 50-300.
Usage: python benchmarks/four_modes.py [--requests 60 2000] [--seed 7] [--backend sim|tiny]
       [--json docs/results/four_modes.json]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.report.load import load_results
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

PROMPTS = (128, 256, 512, 2048, 8192)
BACKENDS = {
    "sim": (1, ["backend.kind=sim", "backend.preset=toy"]),
    # a quarter of the toy's prompts and KV (the tiny model's context is 4,096 tokens): 450 blocks of 16
    # tokens at its 4,096 bytes of KV per token
    "tiny": (4, ["backend.kind=hf", "backend.model=tiny", "backend.threads=1", "backend.warmup_batches=1",
                 f"backend.memory_budget_bytes={450 * 16 * 4096}"]),
}
MODES = {
    "one at a time": ["strategies=[naive]", "naive.batch_size=1"],
    "static batches of 16": ["strategies=[naive]", "naive.batch_size=16"],
    "continuous": ["strategies=[continuous]", "continuous.max_num_batched_tokens=16384", "continuous.preemption=reserve"],
    "continuous, chunked prefill 512": ["strategies=[continuous]", "continuous.chunk_size=512", "continuous.preemption=reserve"],
    # the same two with preemption by recomputation (vLLM's): KV blocks are taken as tokens are computed
    "continuous, recompute": ["strategies=[continuous]", "continuous.max_num_batched_tokens=16384"],
    "continuous, chunked prefill 512, recompute": ["strategies=[continuous]", "continuous.chunk_size=512"],
}


def write_trace(path: Path, n: int, seed: int, scale: int = 1) -> None:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 40.0, n))
    prompts = rng.choice(PROMPTS, n) // scale
    outputs = rng.integers(50, 301, n)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_time", "prompt_len", "output_len"])
        w.writerows(zip((f"{t:.6f}" for t in arrivals), prompts, outputs))


def run_modes(n: int, seed: int, backend: str = "sim") -> dict[str, dict]:
    """Every mode on one trace of n requests: its summary figures."""
    rows = {}
    scale, sets_of_backend = BACKENDS[backend]
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.csv"
        write_trace(trace, n, seed, scale)
        for name, sets in MODES.items():
            cfg = load_user_config(None, [*sets_of_backend, "traffic.arrival=trace",
                                          f"traffic.trace_file={trace}", "traffic.warmup_s=0", "report=false",
                                          *sets])
            out = run_sweep(cfg, Path(tmp) / name.replace(" ", "_").replace(",", ""))
            summary, _, _ = load_results(out)
            s = summary.iloc[0]
            row = {k: float(s[k]) for k in ("throughput_tok_s", "ttft_mean", "ttft_p99", "itl_p99", "e2e_p50")}
            # each request's longest gap between tokens (requests.csv keeps it): p99 ITL pools every
            # gap, so a few long stalls can sit above it while many shorter ones set it
            longest = pd.read_csv(out / "requests.csv")["itl_max"].dropna()
            if len(longest):
                row |= {"itl_max_p50": float(longest.median()), "itl_max": float(longest.max())}
            error = s.get("top_error")
            row |= {"finished": int(s["finished"]), "requests": int(s["num_requests"]),
                    "preemptions": int(s.get("preemptions", 0) or 0), "top_error": error if isinstance(error, str) else ""}
            rows[name] = row
            print(f"{n} requests, {name}: {row['throughput_tok_s']:.0f} tok/s, mean TTFT {row['ttft_mean']:.2f} s, "
                  f"p99 ITL {row['itl_p99'] * 1e3:.1f} ms, {row['finished']} finished, {row['preemptions']} preemptions")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[60, 2000])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="sim")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    workloads = {str(n): run_modes(n, args.seed, args.backend) for n in args.requests}
    record = {"command": "python " + shlex.join(sys.argv), "cpus": os.cpu_count(), "seed": args.seed,
              "backend": args.backend, "load_1min_before": load, "load_1min_after": os.getloadavg()[0],
              "workloads": workloads}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
