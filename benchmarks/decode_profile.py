"""Where the step engine's eager decode step spends its time: torch's profiler over a burst, ops
ranked by their own CPU time.

For each concurrency C a burst of C identical requests (64-token prompts, 64 new tokens) runs
through continuous batching on the step engine (`engine_burst`, as the engine comparison runs
it), once unprofiled (the median decode step) and once under `torch.profiler`. The profiled
burst is one prompt pass then 63 decode steps, so its ops are the decode step's but for about
1/64 of the time. Reported per C: the median decode step unprofiled and profiled, the profiled
ops' own CPU time as a share of the burst, the top ops by own time with their share and calls
per decode step, and the share left outside any op (Python: the scheduler, the engine's
bookkeeping, the model's module calls). The profiler adds its own cost to every op, so shares,
not absolute times, are the figures to read. The whole benchmark, event loop included, runs on
the torch thread (backends/torch_thread.py), so the engine's passes run inline where the
profiler sees them: its steps leave out the hand-off between an event loop and that thread.
The pass is the engine's default (the fused one for this Llama, backends/hf_fused.py), or with
--modules the model's own transformers modules.
Usage: python benchmarks/decode_profile.py [--concurrency 16 64] [--top 12] [--modules] [--json results/decode_profile.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from batchlab.backends import torch_thread
from batchlab.backends.hf_backend import HFBackend
from batchlab.baselines.decode_step import engine_burst, tiny_engine_levels
from batchlab.core.files import write_atomic


async def level(hf: HFBackend, c: int, top: int, clock) -> dict:
    """One concurrency: the median decode step unprofiled, then the ops of a profiled burst."""
    plain = statistics.median(s.duration for s in await engine_burst(hf, c, clock))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        steps = await engine_burst(hf, c, clock)
        wall = time.perf_counter() - start
    ops = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()]
    in_ops = sum(t for _, t, _ in ops)
    n = len(steps)
    return {"concurrency": c, "step_ms_unprofiled": 1e3 * plain,
            "step_ms_profiled": 1e3 * statistics.median(s.duration for s in steps), "decode_steps": n,
            "burst_s": wall, "ops_share": in_ops / wall, "outside_ops_share": 1 - in_ops / wall,
            "top": [{"op": name, "share": t / wall, "calls_per_step": k / (n + 1)}
                    for name, t, k in sorted(ops, key=lambda x: -x[1])[:top]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--modules", action="store_true", help="the pass through transformers' modules (backend.fused false)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    levels = torch_thread.call(tiny_engine_levels, args.concurrency,
                               lambda hf, c, clock: level(hf, c, args.top, clock), fused=False if args.modules else None)
    record = {"command": "python benchmarks/decode_profile.py --concurrency " + " ".join(map(str, args.concurrency))
              + f" --top {args.top}" + (" --modules" if args.modules else "") + (f" --json {args.json}" if args.json else ""),
              "pass": "modules" if args.modules else "fused",
              "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "levels": levels}
    for lv in levels:
        print(f"C={lv['concurrency']}: decode step {lv['step_ms_unprofiled']:.2f} ms ({lv['step_ms_profiled']:.2f} profiled, "
              f"{lv['decode_steps']} steps); in torch ops {100 * lv['ops_share']:.0f} %, outside {100 * lv['outside_ops_share']:.0f} %")
        for o in lv["top"]:
            print(f"    {o['op']:<40} {100 * o['share']:5.1f} %  {o['calls_per_step']:5.1f} calls per step")
    if args.json:
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
