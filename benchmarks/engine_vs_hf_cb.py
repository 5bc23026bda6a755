"""batchlab continuous vs transformers' continuous batching vs plain generate(), one model, one trace.

At each concurrency C (16 and 64): a burst of N = --burst x C requests arrives at once (prompt and
output lengths drawn uniformly, seeded), and each system keeps at most C of them in flight:
  - batchlab continuous: ContinuousScheduler(max_num_seqs=C) + the step engine (HFBackend.step),
    eager ("ours") and with backend.compile ("ours-compiled": decode buckets built before timing),
    both with the fused pass (backends/hf_fused.py); with --modules also eager through
    transformers' modules ("ours-modules", backend.fused false): the fused pass's gain in one run;
  - hf-cb: transformers' manager (max_requests_per_batch=C, same KV blocks, same token budget),
    each run in a fresh process of its own, as a user's process runs it (`hf_cb_alone`);
  - generate(): HFBackend.run_batch on batches of C in arrival order (padded, run to the longest).
Throughput = output tokens / (last completion - first arrival). Per-step time: a fixed batch of
C requests (64-token prompts, 64 new tokens): the engine's median decode-only step vs the median
gap between generate()'s per-token stamps. Efficiency of the continuous run: achieved tok/s
divided by B / t_step(B) at its mean occupancy B (t_step fitted to its own decode-only steps), and
where its time went (step log: decode passes, prefill passes, our overhead in and between steps).
Systems alternate order per repeat; figures are medians over repeats, ratios from one run.
Roofline: this CPU's matrix FLOP/s (a 1024^3 float32 product) and copy bandwidth (256 MiB), measured
at the start with the benchmark's threads; a decode step's bound is the longer of reading every
linear weight and the rows' K/V once, and computing its products, at those rates (`roofline`).
With --busy DUTY every engine runs beside a job burning DUTY of every core (baselines/background.py),
the roofline measured before it starts.
Usage: python benchmarks/engine_vs_hf_cb.py [--concurrency 16 64] [--repeats 3] [--threads N] [--compile both|on|off]
       [--modules] [--busy DUTY]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from batchlab.backends import hf_common as hc
from batchlab.backends import torch_thread
from batchlab.backends.hf import HFOptions
from batchlab.backends.hf_backend import HFBackend
from batchlab.backends.hf_cb import HFCBOptions
from batchlab.backends.hf_cb_backend import HFCBBackend
from batchlab.backends.hf_engine import backend_efficiency, step_breakdown
from batchlab.baselines.background import background_load
from batchlab.baselines.decode_step import BLOCK, kv_blocks, step_times
from batchlab.core.clock import RealClock
from batchlab.core.metrics import summarize
from batchlab.core.request import Request, Status
from batchlab.core.traffic import TraceItem, make_requests
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import ContinuousConfig
from batchlab.schedulers.continuous import ContinuousScheduler

CB_TARGET = {16: 2.0, 64: 3.0}        # ours / hf-cb throughput (>=), per concurrency
EFF_TARGET = 0.90                      # backend_eff (>=) at every level


def burst(n: int, seed: int, prompt=(32, 96), output=(16, 96)) -> list[TraceItem]:
    rng = np.random.default_rng(seed)
    return [TraceItem(0.0, int(rng.integers(*prompt, endpoint=True)), int(rng.integers(*output, endpoint=True)))
            for _ in range(n)]


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
    out["breakdown"] = step_breakdown(steps)
    out["tokens"] = {r.index: r.output_token_ids for r in reqs}
    return out


async def hf_cb(lm: hc.Loaded, trace, c: int, clock) -> dict:
    cont = ContinuousConfig(max_num_seqs=c, block_size=BLOCK, num_kv_blocks=kv_blocks(trace, c))
    cb = HFCBBackend(HFCBOptions(model="tiny", warmup_batches=1), cont, lm)
    await cb.start(clock)
    try:
        reqs, t0 = await cb.run_trace(trace, clock)
    finally:
        await cb.close()
    return result(reqs, t0)


def hf_cb_alone(trace, c: int, threads: int | None) -> dict:
    """In a process of its own: transformers' continuous batching as a user's process runs it (the
    model loaded on the main thread, passes on its manager's thread), with no OpenMP team of ours
    alive beside it: a second team throttles every team (backends/torch_thread.py), and in this
    process our engine's would be one."""
    if threads:
        torch.set_num_threads(threads)
    lm = hc.load(HFOptions(model="tiny", device="cpu", dtype="float32"))
    clock = RealClock()
    return clock.run(hf_cb(lm, trace, c, clock))


async def hf_cb_process(trace, c: int, threads: int | None) -> dict:
    """`hf_cb_alone` in a fresh spawned process (start-up and loading are outside its timing)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, hf_cb_alone, trace, c, threads)


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


def machine_roofline(repeats: int = 5) -> dict:
    """Attainable matrix FLOP/s and memory bandwidth (bytes read + written per second), medians."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    src = torch.ones(64 << 20)
    dst = torch.empty_like(src)

    def median_s(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    return {"matmul_flop_s": 2 * 1024**3 / median_s(lambda: torch.mm(a, b)),
            "copy_bytes_s": 2 * src.nbytes / median_s(lambda: dst.copy_(src)), "repeats": repeats,
            "how": "float32 1024x1024 @ 1024x1024; a 256 MiB copy counts its read and its write"}


def roofline(model, kv_bytes_per_token: int, rows: int, context: int, roof: dict) -> dict:
    """A decode step's lower bound at `rows` rows of `context` tokens: every linear weight and the
    rows' K/V read once (bandwidth) or its products computed (FLOP/s), whichever takes longer."""
    cfg = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    read = linear * model.dtype.itemsize + rows * context * kv_bytes_per_token
    attn = 4 * rows * context * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers
    flops = 2 * linear * rows + attn
    return {"bound_ms": 1e3 * max(read / roof["copy_bytes_s"], flops / roof["matmul_flop_s"]),
            "read_ms": 1e3 * read / roof["copy_bytes_s"], "compute_ms": 1e3 * flops / roof["matmul_flop_s"]}


def agreement(a: dict, b: dict) -> float:
    """Fraction of requests whose tokens are identical in the two runs."""
    return sum(a[k] == b[k] for k in a) / len(a)


STEP_CONTEXT = 96            # step_times' median context: 64-token prompts, 64 new tokens


async def measure(engines: dict[str, HFBackend], c: int, repeats: int, burst_x: int, clock, roof: dict,
                  threads: int | None) -> dict:
    trace = burst(burst_x * c, seed=c)
    hf = engines["ours"] if "ours" in engines else next(iter(engines.values()))
    systems = {name: (lambda e=e: ours(e, trace, c, clock)) for name, e in engines.items()}
    systems |= {"hf-cb": lambda: hf_cb_process(trace, c, threads), "generate": lambda: generate(hf, trace, c, clock)}
    runs = {name: [] for name in systems}
    steps = {name: [] for name in engines}
    for k in range(repeats):
        order = list(systems) if k % 2 == 0 else list(reversed(systems))
        for name in order:
            runs[name].append(await systems[name]())
            print(f"  C={c:3d} repeat {k}: {name:13s} {runs[name][-1]['tok_s']:7.0f} tok/s", flush=True)
        for name, e in engines.items():
            steps[name].append(await step_times(e, c, clock))
            print(f"  C={c:3d} repeat {k}: decode step {name} {steps[name][-1][0] * 1e3:.2f} ms, "
                  f"generate {steps[name][-1][1] * 1e3:.2f} ms")
    med = lambda name, key: statistics.median(r[key] for r in runs[name])
    ratio = lambda a, b: [x["tok_s"] / y["tok_s"] for x, y in zip(runs[a], runs[b])]
    out = {"concurrency": c, "requests": len(trace), "output_tokens": sum(t.output_len for t in trace),
           "tok_s": {n: med(n, "tok_s") for n in runs},
           "ttft_p50_s": {n: med(n, "ttft_p50") for n in runs},
           "tok_s_per_repeat": {n: [r["tok_s"] for r in runs[n]] for n in runs}, "engines": {},
           "roofline": roofline(hf.loaded.model, hf.kv_bytes_per_token, c, STEP_CONTEXT, roof)}
    for name in engines:
        st = steps[name]
        out["engines"][name] = {
            "over_hf_cb": statistics.median(ratio(name, "hf-cb")), "over_hf_cb_per_repeat": ratio(name, "hf-cb"),
            "over_generate": statistics.median(ratio(name, "generate")),
            "over_generate_per_repeat": ratio(name, "generate"),
            "step_ms": {"ours": 1e3 * statistics.median(x[0] for x in st),
                        "generate": 1e3 * statistics.median(x[1] for x in st)},
            "step_ratio": statistics.median(a / b for a, b in st),
            "step_over_bound": 1e3 * statistics.median(x[0] for x in st) / out["roofline"]["bound_ms"],
            "efficiency": med(name, "efficiency"), "efficiency_per_repeat": [r["efficiency"] for r in runs[name]],
            "occupancy": med(name, "occupancy"), "busy_frac": med(name, "busy_frac"),
            "breakdown": {k: statistics.median(r["breakdown"][k] for r in runs[name]) for k in runs[name][0]["breakdown"]},
            "same_tokens_as_generate": agreement(runs[name][0]["tokens"], runs["generate"][0]["tokens"])}
    for a, b, key in (("ours-compiled", "ours", "compiled_over_eager"), ("ours", "ours-modules", "fused_over_modules")):
        if a in engines and b in engines:
            out[f"{key}_per_repeat"] = ratio(a, b)
            out[key] = statistics.median(out[f"{key}_per_repeat"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--burst", type=int, default=3, help="requests per level = BURST x concurrency")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--compile", choices=["both", "on", "off"], default="both",
                    help="our engine eager (off), with backend.compile (on), or both side by side")
    ap.add_argument("--modules", action="store_true",
                    help="also our engine eager through transformers' modules (backend.fused false)")
    ap.add_argument("--busy", type=float, default=None, metavar="DUTY",
                    help="burn DUTY (0-1) of every core beside the engines, as another job on the machine would")
    ap.add_argument("--out", default="results/bench/engine_vs_hf_cb.json")
    args = ap.parse_args()
    if args.busy is not None and not 0 < args.busy <= 1:
        ap.error(f"--busy: a share of each core, 0 < DUTY <= 1 (got {args.busy:g})")   # before anything runs
    load_before = os.getloadavg()
    if args.threads:
        torch.set_num_threads(args.threads)
    roof = torch_thread.call(machine_roofline)            # no OpenMP team on the main thread; quiet: the machine's own
    cores = list(range(os.cpu_count() or 1))
    with background_load(cores, args.busy) if args.busy else contextlib.nullcontext() as busy:
        levels, setup, warm = run_engines(args, roof)
    report(levels, setup, args, {"before": load_before, "after": os.getloadavg()}, warm, roof, busy)


def run_engines(args, roof: dict) -> tuple[list[dict], dict, dict]:
    """Start every engine of the comparison, warm it, measure each concurrency in turn; the
    levels, the engines' set-up and their start-up times."""
    kinds = {"both": [False, True], "on": [True], "off": [False]}[args.compile]
    kinds = [(k, None) for k in kinds] + ([(False, False)] if args.modules else [])
    engines, lm = {}, None
    for compile, fused in kinds:
        hf = HFBackend(HFOptions(model="tiny", device="cpu", dtype="float32", warmup_batches=1, compile=compile,
                                 fused=fused), warmup_shape=(8, 64, 8), decode_rows=max(args.concurrency), loaded=lm)
        engines["ours-modules" if fused is False else "ours-compiled" if compile else "ours"] = hf
        lm = hf._ensure_loaded()
    clock = RealClock()
    warm = {}

    async def run_all():
        for name, hf in engines.items():
            t0 = clock.now()
            await hf.start(clock)                               # compile: every decode bucket built here
            await step_times(hf, 8, clock, 16, 8)               # warm the engine
            warm[name] = {"start_s": clock.now() - t0,
                          "graphs": hf.engine.decode.compiles if hf.engine.decode is not None else 0}
        levels = [await measure(engines, c, args.repeats, args.burst, clock, roof, args.threads) for c in args.concurrency]
        for name, hf in engines.items():
            warm[name]["graphs_after"] = hf.engine.decode.compiles if hf.engine.decode is not None else 0
        return levels
    levels = clock.run(run_all())
    return levels, next(iter(engines.values())).describe(), warm


def report(levels: list[dict], setup: dict, args, load: dict, warm: dict, roof: dict, busy: dict | None) -> None:
    print(f"\nsetup: {setup['model']} on {setup['device']} ({setup['dtype']}), torch threads {torch.get_num_threads()}, "
          f"repeats {args.repeats}, burst {args.burst} x C requests; start-up {warm}")
    print(f"{'C':>4} {'engine':>13} {'tok/s':>7} {'hf-cb':>7} {'generate':>8} {'/hf-cb':>7} {'/gen':>6} "
          f"{'step':>8} {'step gen':>8} {'eff':>5} {'B':>5} {'decode':>6} {'prefill':>7} {'ovh':>5} {'gap':>5} {'same tok':>8}")
    for lv in levels:
        t = lv["tok_s"]
        for name, e in lv["engines"].items():
            b = e["breakdown"]
            print(f"{lv['concurrency']:>4} {name:>13} {t[name]:>7.0f} {t['hf-cb']:>7.0f} {t['generate']:>8.0f} "
                  f"{e['over_hf_cb']:>6.2f}x {e['over_generate']:>5.2f}x {e['step_ms']['ours']:>6.2f}ms "
                  f"{e['step_ms']['generate']:>6.2f}ms {e['efficiency']:>5.2f} {e['occupancy']:>5.1f} "
                  f"{b['decode_frac']:>6.1%} {b['prefill_frac']:>7.1%} {b['overhead_frac']:>5.1%} {b['gap_frac']:>5.1%} "
                  f"{e['same_tokens_as_generate']:>8.0%}")
        for key, what in (("compiled_over_eager", "compiled / eager"), ("fused_over_modules", "fused / modules")):
            if key in lv:
                print(f"{lv['concurrency']:>4} {what} throughput {lv[key]:.2f}x "
                      f"(per repeat {', '.join(f'{x:.2f}' for x in lv[f'{key}_per_repeat'])})")
    for name in levels[0]["engines"]:
        ok = {f"/hf-cb >= {CB_TARGET[c]}x at {c}": lv["engines"][name]["over_hf_cb"] >= CB_TARGET[c]
              for lv in levels for c in [lv["concurrency"]] if c in CB_TARGET}
        ok |= {f"backend_eff >= {EFF_TARGET} at {lv['concurrency']}": lv["engines"][name]["efficiency"] >= EFF_TARGET
               for lv in levels}
        print(f"targets ({name}): " + "; ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in ok.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/engine_vs_hf_cb.py " + " ".join(
        [f"--concurrency {' '.join(map(str, args.concurrency))}", f"--repeats {args.repeats}", f"--burst {args.burst}",
         f"--compile {args.compile}"] + (["--modules"] if args.modules else [])
        + ([f"--threads {args.threads}"] if args.threads else []) + ([f"--busy {args.busy:g}"] if args.busy else [])
        + [f"--out {args.out}"])
    out.write_text(json.dumps({"command": command, "setup": setup, "threads": torch.get_num_threads(),
                               "load_avg_1_5_15": load, "cpus": os.cpu_count(), "start_up": warm, "machine": roof,
                               "busy": {k: busy[k] for k in ("cores", "duty", "period_s")} if busy else None,
                               "targets": {"ours_over_hf_cb": {str(k): v for k, v in CB_TARGET.items()},
                                           "backend_eff": EFF_TARGET},
                               "levels": levels}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
