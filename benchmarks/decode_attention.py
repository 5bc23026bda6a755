"""A candidate for the engine's eager decode step: its single-token rows attended by two matmuls and
a softmax instead of torch's SDPA kernel, timed against it interleaved in one process.

In isolation (one call, the engine's shapes, keys a strided slice of a larger cache) the matmuls
take about half SDPA's time on a 2-core CPU; this measures whether the whole step gains it.

For each concurrency C, rounds alternate the attention (the order flips every round, so a drift
of the machine's speed falls on both alike); each round times the engine's decode-only steps of a
burst of C identical requests (64-token prompts, 64 new tokens; `step_times`, the median step).
Reported per C: each variant's median step over the rounds, the per-round ratio plain / SDPA and
its median, the tokens of the two variants (the same, or the change is not exact), and the
machine's load before and after.
Usage: python benchmarks/decode_attention.py [--concurrency 16 64] [--rounds 6] [--json results/decode_attention.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from batchlab.backends import hf_slots
from batchlab.backends.hf_backend import HFBackend
from batchlab.baselines.decode_step import step_times, tiny_engine_levels
from batchlab.core.files import write_atomic


def plain(q, k, v, attn_mask=None, scale=None):
    """q [S, Hkv, G, D] against k / v [S, Hkv, L, D], additive mask [S, 1, 1, L] (SDPA's signature)."""
    mask = attn_mask
    if mask is None:             # a prompt row that needs no mask: leave it to SDPA (only decode steps are timed)
        return sdpa(q, k, v, mask, scale)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5 if scale is None else scale).add_(mask)
    return torch.matmul(torch.softmax(scores, -1), v)


def sdpa(q, k, v, attn_mask=None, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


VARIANTS = {"plain": plain, "sdpa": sdpa}


class Swapped:
    """torch.nn.functional as the engine's attention module sees it, with SDPA replaced by `fn`
    (every other name passed through)."""

    def __init__(self, fn):
        self.scaled_dot_product_attention = fn

    def __getattr__(self, name):
        return getattr(F, name)


async def rounds(hf: HFBackend, c: int, n: int, clock) -> dict:
    steps: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in range(n):
        for name in (VARIANTS if k % 2 == 0 else reversed(list(VARIANTS))):
            hf_slots.F = Swapped(VARIANTS[name])
            steps[name].append((await step_times(hf, c, clock))[0])
            print(f"  C={c:3d} round {k}: {name:5s} decode step {1e3 * steps[name][-1]:.2f} ms", flush=True)
    hf_slots.F = F
    ratios = [p / s for p, s in zip(steps["plain"], steps["sdpa"])]
    return {"concurrency": c, "step_ms": {v: 1e3 * statistics.median(t) for v, t in steps.items()},
            "steps_ms": {v: [1e3 * x for x in t] for v, t in steps.items()},
            "plain_over_sdpa": statistics.median(ratios), "per_round": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    levels = tiny_engine_levels(args.concurrency, lambda hf, c, clock: rounds(hf, c, args.rounds, clock))
    record = {"command": "python benchmarks/decode_attention.py --concurrency " + " ".join(map(str, args.concurrency))
              + f" --rounds {args.rounds}" + (f" --json {args.json}" if args.json else ""),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "levels": levels}
    for lv in levels:
        print(f"C={lv['concurrency']}: plain {lv['step_ms']['plain']:.2f} ms, sdpa {lv['step_ms']['sdpa']:.2f} ms, "
              f"plain / sdpa {lv['plain_over_sdpa']:.3f} (per round {', '.join(f'{r:.2f}' for r in lv['per_round'])})")
    if args.json:
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
