"""batchlab continuous vs transformers' continuous batching vs plain generate(), one model, one trace.

At each concurrency C (16 and 64): a burst of N = --burst x C requests arrives at once (prompt and
output lengths drawn uniformly, seeded), and each system keeps at most C of them in flight:
  - batchlab continuous: ContinuousScheduler(max_num_seqs=C) + the step engine (HFBackend.step);
  - hf-cb: transformers' manager (max_requests_per_batch=C, same KV blocks, same token budget);
  - generate(): HFBackend.run_batch on batches of C in arrival order (padded, run to the longest).
Throughput = output tokens / (last completion - first arrival). Per-step time: a fixed batch of
C requests (64-token prompts, 64 new tokens): the engine's median decode-only step vs the median
gap between generate()'s per-token stamps. Efficiency of the continuous run: achieved tok/s
divided by B / t_step(B) at its mean occupancy B (t_step fitted to its own decode-only steps).
Systems alternate order per repeat; figures are medians over repeats, ratios from one process.
Usage: python benchmarks/engine_vs_hf_cb.py [--concurrency 16 64] [--repeats 3] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np
import torch

from batchlab.backends import hf_common as hc
from batchlab.backends.hf import HFBackend
from batchlab.backends.hf_cb import HFCBBackend
from batchlab.backends.hf_engine import backend_efficiency
from batchlab.core.clock import RealClock
from batchlab.core.config import BackendConfig, ContinuousConfig
from batchlab.core.metrics import summarize
from batchlab.core.request import Request, Status
from batchlab.core.traffic import TraceItem, make_requests
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers.continuous import ContinuousScheduler

BLOCK = 16
CB_TARGET, STEP_TARGET = 1.5, 1.2     # ours / hf-cb throughput (>=); ours / generate() step (<=)


def burst(n: int, seed: int, prompt=(32, 96), output=(16, 96)) -> list[TraceItem]:
    rng = np.random.default_rng(seed)
    return [TraceItem(0.0, int(rng.integers(*prompt, endpoint=True)), int(rng.integers(*output, endpoint=True)))
            for _ in range(n)]


def kv_blocks(trace: list[TraceItem], c: int) -> int:
    """Enough KV for C of the longest sequences: nobody is preempted, both engines get the same."""
    longest = max(t.prompt_len + t.output_len for t in trace)
    return c * -(-longest // BLOCK) + c


async def ours(hf: HFBackend, trace, c: int, clock) -> dict:
    cont = ContinuousConfig(max_num_seqs=c, block_size=BLOCK)
    engine = hf._engine()
    mark = len(engine.step_log)
    t0 = clock.now()
    reqs = make_requests(trace, t0, hf.prepare)
    await drive(ContinuousScheduler(cont, kv_blocks(trace, c)), hf, clock, Inbox(reqs))
    out = result(reqs, t0)
    steps = engine.step_log[mark:]
    eff = backend_efficiency(steps, out["tok_s"])
    out["efficiency"], out["occupancy"] = eff["backend_eff"], eff["occupancy"]
    out["busy_frac"] = sum(s.duration for s in steps) / out["wall_s"]
    out["tokens"] = {r.index: r.output_token_ids for r in reqs}
    return out


async def hf_cb(lm: hc.Loaded, trace, c: int, clock) -> dict:
    cont = ContinuousConfig(max_num_seqs=c, block_size=BLOCK, num_kv_blocks=kv_blocks(trace, c))
    cb = HFCBBackend(BackendConfig(model="tiny", warmup_batches=1), cont, lm)
    await cb.start(clock)
    try:
        reqs, t0 = await cb.run_trace(trace, clock)
    finally:
        await cb.close()
    return result(reqs, t0)


async def generate(hf: HFBackend, trace, c: int, clock) -> dict:
    t0 = clock.now()
    reqs = make_requests(trace, t0, hf.prepare)
    for i in range(0, len(reqs), c):
        batch = reqs[i:i + c]
        for r in batch:
            r.scheduled_time = clock.now()
        await hf.run_batch(batch, clock)
        for r in batch:
            r.status = Status.FINISHED if r.output_len == r.max_new_tokens else Status.FAILED
    out = result(reqs, t0)
    out["tokens"] = {r.index: r.output_token_ids for r in reqs}
    return out


def result(reqs: list[Request], t0: float) -> dict:
    failed = [r for r in reqs if r.status is not Status.FINISHED]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed, e.g. {failed[0].error}")
    s = summarize(reqs)
    return {"tok_s": s["throughput_tok_s"], "wall_s": max(r.completion_time for r in reqs) - t0,
            "ttft_p50": s["ttft_p50"], "tpot_p50": s["tpot_p50"]}


async def step_times(hf: HFBackend, c: int, clock, p: int = 64, o: int = 64) -> tuple[float, float]:
    """Median decode step (seconds) at batch C: the engine, then generate()."""
    trace = [TraceItem(0.0, p, o)] * c
    engine = hf._engine()
    mark = len(engine.step_log)
    await drive(ContinuousScheduler(ContinuousConfig(max_num_seqs=c, block_size=BLOCK), kv_blocks(trace, c)),
                hf, clock, Inbox(make_requests(trace, clock.now(), hf.prepare)))
    ours = [s.duration for s in engine.step_log[mark:] if s.prefill_tokens == 0 and s.rows == c]
    reqs = make_requests(trace, clock.now(), hf.prepare)
    await hf.run_batch(reqs, clock)
    gaps = np.diff(reqs[0].token_times)
    return statistics.median(ours), float(np.median(gaps))


def agreement(a: dict, b: dict) -> float:
    """Fraction of requests whose tokens are identical in the two runs."""
    return sum(a[k] == b[k] for k in a) / len(a)


async def measure(hf: HFBackend, c: int, repeats: int, burst_x: int, clock) -> dict:
    trace = burst(burst_x * c, seed=c)
    runs = {"ours": [], "hf-cb": [], "generate": []}
    steps = []
    systems = {"ours": lambda: ours(hf, trace, c, clock), "hf-cb": lambda: hf_cb(hf.loaded, trace, c, clock),
               "generate": lambda: generate(hf, trace, c, clock)}
    for k in range(repeats):
        order = list(systems) if k % 2 == 0 else list(reversed(systems))
        for name in order:
            runs[name].append(await systems[name]())
            print(f"  C={c:3d} repeat {k}: {name:8s} {runs[name][-1]['tok_s']:7.0f} tok/s", flush=True)
        steps.append(await step_times(hf, c, clock))
        print(f"  C={c:3d} repeat {k}: decode step ours {steps[-1][0] * 1e3:.2f} ms, generate {steps[-1][1] * 1e3:.2f} ms")
    med = lambda name, key: statistics.median(r[key] for r in runs[name])
    return {
        "concurrency": c, "requests": len(trace), "output_tokens": sum(t.output_len for t in trace),
        "tok_s": {n: med(n, "tok_s") for n in runs},
        "ttft_p50_s": {n: med(n, "ttft_p50") for n in runs},
        "tok_s_per_repeat": {n: [r["tok_s"] for r in runs[n]] for n in runs},
        "ours_over_hf_cb": statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(runs["ours"], runs["hf-cb"])),
        "ours_over_generate": statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(runs["ours"], runs["generate"])),
        "ours_over_hf_cb_per_repeat": [a["tok_s"] / b["tok_s"] for a, b in zip(runs["ours"], runs["hf-cb"])],
        "ours_over_generate_per_repeat": [a["tok_s"] / b["tok_s"] for a, b in zip(runs["ours"], runs["generate"])],
        "step_ms": {"ours": 1e3 * statistics.median(s[0] for s in steps),
                    "generate": 1e3 * statistics.median(s[1] for s in steps)},
        "step_ratio": statistics.median(a / b for a, b in steps),
        "efficiency": med("ours", "efficiency"), "occupancy": med("ours", "occupancy"),
        "busy_frac": med("ours", "busy_frac"),
        "same_tokens_as_generate": agreement(runs["ours"][0]["tokens"], runs["generate"][0]["tokens"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--burst", type=int, default=3, help="requests per level = BURST x concurrency")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--out", default="results/bench/engine_vs_hf_cb.json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    if args.threads:
        torch.set_num_threads(args.threads)
    hf = HFBackend(BackendConfig(model="tiny", device="cpu", dtype="float32", warmup_batches=1),
                   warmup_shape=(8, 64, 8))
    clock = RealClock()

    async def run_all():
        await hf.start(clock)
        await step_times(hf, 8, clock, 16, 8)               # warm the engine
        return [await measure(hf, c, args.repeats, args.burst, clock) for c in args.concurrency]
    levels = clock.run(run_all())
    report(levels, hf.describe(), args, {"before": load_before, "after": os.getloadavg()})


def report(levels: list[dict], setup: dict, args, load: dict) -> None:
    print(f"\nsetup: {setup['model']} on {setup['device']} ({setup['dtype']}), torch threads {torch.get_num_threads()}, "
          f"repeats {args.repeats}, burst {args.burst} x C requests")
    print(f"{'C':>4} {'ours tok/s':>10} {'hf-cb':>8} {'generate':>9} {'ours/hf-cb':>10} {'ours/gen':>8} "
          f"{'step ours':>9} {'step gen':>8} {'step ratio':>10} {'eff':>5} {'B':>5} {'same tok':>8}")
    for lv in levels:
        t, s = lv["tok_s"], lv["step_ms"]
        print(f"{lv['concurrency']:>4} {t['ours']:>10.0f} {t['hf-cb']:>8.0f} {t['generate']:>9.0f} "
              f"{lv['ours_over_hf_cb']:>9.2f}x {lv['ours_over_generate']:>7.2f}x {s['ours']:>7.2f}ms "
              f"{s['generate']:>6.2f}ms {lv['step_ratio']:>9.2f}x {lv['efficiency']:>5.2f} {lv['occupancy']:>5.1f} "
              f"{lv['same_tokens_as_generate']:>8.0%}")
    ok_cb = all(lv["ours_over_hf_cb"] >= CB_TARGET for lv in levels)
    ok_step = all(lv["step_ratio"] <= STEP_TARGET for lv in levels)
    print(f"targets: ours/hf-cb >= {CB_TARGET}: {'met' if ok_cb else 'NOT met'}; "
          f"step time <= {STEP_TARGET}x generate(): {'met' if ok_step else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/engine_vs_hf_cb.py " + " ".join(
        [f"--concurrency {' '.join(map(str, args.concurrency))}", f"--repeats {args.repeats}", f"--burst {args.burst}"]
        + ([f"--threads {args.threads}"] if args.threads else []) + [f"--out {args.out}"])
    out.write_text(json.dumps({"command": command, "setup": setup, "threads": torch.get_num_threads(),
                               "load_avg_1_5_15": load, "cpus": os.cpu_count(), "levels": levels}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
