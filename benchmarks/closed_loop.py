"""A closed loop at 1, 4, 16 and 64 users on three backends: the simulator, the Hugging Face step
engine (the tiny model, real time) and a server (`batchlab serve` over the same model, sent to
through the OpenAI client), each point `traffic.arrival: closed` as any sweep runs it.

Per backend and level: output tokens/s, requests/s, p50 and p95 E2E, p50 TTFT and TPOT, the mean
number of requests in the system (Little's L: a closed loop of N users holds exactly N) and the
most ever in the system at once from the stamps (never more than N). Then whether throughput and
p95 E2E rise with every level (`rising`), the machine's 1-minute load beside each backend's run.
The simulator runs configs/closed-loop.yaml (the 7B preset) with continuous batching; the engine
and the server run the same closed traffic on the tiny model with continuous batching, the server
pinned to its own core where there are two (the load generator on the other).
Usage: python benchmarks/closed_loop.py [--levels 1 4 16 64] [--duration 20] [--backends sim hf server]
       [--json docs/results/closed_loop.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from batchlab.backends import make_backend, process
from batchlab.core.files import write_atomic
from batchlab.run.config import load_config, load_user_config
from batchlab.run.point import run_point

ROOT = Path(__file__).resolve().parents[1]
PORT = 8011
TINY = ["backend.kind=hf", "backend.model=tiny", "backend.threads=1", "backend.warmup_batches=2",
        "continuous.max_num_seqs=64", "continuous.max_num_batched_tokens=2048",
        "traffic.prompt_len={dist: uniform, low: 16, high: 64}", "traffic.output_len={dist: uniform, low: 16, high: 48}"]
METRICS = ("throughput_tok_s", "requests_per_s", "e2e_p50", "e2e_p95", "ttft_p50", "tpot_p50", "little_L", "finished", "failed")


def peak_in_system(requests) -> int:
    """The most requests in the system at once, from arrival and last-token stamps alone."""
    events = sorted([(r.arrival_time, 1) for r in requests]
                    + [(r.token_times[-1] if r.token_times else r.arrival_time, -1) for r in requests])
    peak = now = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def levels_of(cfg, levels: list[int], backend) -> list[dict]:
    rows = []
    for n in levels:
        res = run_point(cfg, "continuous" if cfg.backend.kind != "openai" else "server", float(n), 0, backend)
        row = {"users": n, **{k: res.summary[k] for k in METRICS}, "peak_in_system": peak_in_system(res.requests)}
        rows.append(row)
        print(f"  {n:3d} users: {row['throughput_tok_s']:8.1f} tok/s  {row['requests_per_s']:6.2f} req/s  "
              f"p95 E2E {row['e2e_p95']:.3f} s  L {row['little_L']:.2f}  peak {row['peak_in_system']}", flush=True)
    return rows


def closed(levels: list[int], duration: float) -> list[str]:
    return ["traffic.arrival=closed", f"traffic.concurrency={levels}", f"traffic.duration_s={duration}",
            "traffic.warmup_s=5", "strategies=[continuous]", "report=false"]


def run_backend(name: str, levels: list[int], duration: float) -> dict:
    print(f"{name}:", flush=True)
    load_before = os.getloadavg()[0]
    if name == "sim":
        cfg = load_user_config(str(ROOT / "configs" / "closed-loop.yaml"), closed(levels, duration))
        rows = levels_of(cfg, levels, make_backend(cfg))
        what = "simulator, configs/closed-loop.yaml (llama2-7b-a100 preset), continuous"
    elif name == "hf":
        cfg = load_config(None, TINY + closed(levels, duration))
        rows = levels_of(cfg, levels, make_backend(cfg))
        what = "Hugging Face step engine, tiny model (4.7M parameters, CPU, 1 thread), continuous"
    else:
        cpus = process.split_cores()
        sets = [s for s in TINY if s.startswith(("backend.", "continuous."))]
        cmd = process.serve_command(PORT, "continuous", None, sets, "tiny", "--max-queue", "100000")
        with process.managed("batchlab-serve-closed-loop", cmd, f"http://127.0.0.1:{PORT}/v1", "tiny", cpus=cpus) as srv:
            cfg = load_config(None, [s for s in TINY if s.startswith("traffic.")] + closed(levels, duration)
                              + ["backend.kind=openai", f"backend.base_url={srv.url}", "backend.model=tiny",
                                 "strategies=[server]"])
            rows = levels_of(cfg, levels, make_backend(cfg))
        what = f"batchlab serve over the tiny model (continuous, {'pinned to core ' + cpus if cpus else 'unpinned'}), OpenAI client"
    tput, p95 = [r["throughput_tok_s"] for r in rows], [r["e2e_p95"] for r in rows]
    rising = {"throughput": all(a < b for a, b in zip(tput, tput[1:])), "e2e_p95": all(a < b for a, b in zip(p95, p95[1:]))}
    return {"backend": what, "levels": rows, "rising": rising,
            "load_1min_before": load_before, "load_1min_after": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--duration", type=float, default=20.0, help="Seconds of traffic per level, after 5 s of warm-up.")
    ap.add_argument("--backends", nargs="+", choices=["sim", "hf", "server"], default=["sim", "hf", "server"])
    ap.add_argument("--json", default=None, help="Write the results here.")
    args = ap.parse_args()
    out = {"command": "python benchmarks/closed_loop.py " + shlex.join(sys.argv[1:]), "cpus": os.cpu_count(),
           "duration_s": args.duration, "warmup_s": 5.0, "backends": {}}
    for name in args.backends:
        out["backends"][name] = run_backend(name, args.levels, args.duration)
        if args.json:                    # after each backend: a later failure keeps what was measured
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(args.json, json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
