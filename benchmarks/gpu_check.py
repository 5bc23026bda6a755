"""The GPU check's two in-process stages (benchmarks/gpu_check.sh runs them; each writes one JSON).

`engine`: one model loaded once, then
  - step speed: the step engine's median decode step vs generate()'s at batch 16 and 64 (target
    <= 1.2x, as on CPU; batchlab/baselines/decode_step.py, 64-token prompts);
  - a deliberately small KV budget (backend.memory_budget_bytes = 4 rows of 600 tokens) and 20
    requests arriving within 0.1 s: dynamic must launch on its memory trigger, continuous must run
    within the blocks the budget gives (preempting if it must), and nothing may fail;
  - a real oversize batch: the CUDA allocator is capped at what it holds plus 4 GiB (so the card
    need not be filled, and a 7B prefill is not wasted on 100 GB), then 64 prompts of ~1,024 tokens
    arrive at once: generate() raises torch.OutOfMemoryError, dynamic halves its cap until a batch
    fits and loses nothing; naive records the batch as failed with the allocator's words.
`ratios`: the matching roofline preset against each measured profile, term by term.
Usage: python benchmarks/gpu_check.py engine --model random:mistral-7b --out engine.json
       python benchmarks/gpu_check.py ratios --preset mistral-7b-h200 --out ratios.json PROFILE...
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

STEP_TARGET = 1.2
MiB, GiB = 1 << 20, 1 << 30


def engine_stage(args) -> dict:
    import torch

    from batchlab.backends.hf_backend import HFBackend
    from batchlab.core.clock import RealClock
    from batchlab.run.config import load_config
    base = [f"backend.model={args.model}", f"backend.device={args.device}", f"backend.dtype={args.dtype}",
            "backend.kind=hf", "backend.warmup_batches=1"]
    hf = HFBackend(load_config(None, base).backend, warmup_shape=(16, 128, 8))
    clock = RealClock()
    clock.run(hf.start(clock))
    out = {"setup": hf.describe(), "step_target": STEP_TARGET}
    try:
        out["step"] = step_speed(hf, clock, args.concurrency, args.repeats)
        out["small_budget"] = small_budget(hf, base)
        if hf.loaded.device.type == "cuda":
            out["real_oom"] = real_oom(hf, base, torch)
        else:
            out["real_oom"] = {"skipped": "needs CUDA: the allocator cap is torch.cuda's"}
    finally:
        clock.run(hf.close())
    return out


def step_speed(hf, clock, levels: list[int], repeats: int) -> dict:
    from batchlab.baselines.decode_step import step_times
    clock.run(step_times(hf, 8, clock, 16, 8))                 # warm the engine's kernels
    res = {}
    for c in levels:
        pairs = [clock.run(step_times(hf, c, clock)) for _ in range(repeats)]
        ratio = statistics.median(a / b for a, b in pairs)
        res[str(c)] = {"engine_ms": 1e3 * statistics.median(a for a, _ in pairs),
                       "generate_ms": 1e3 * statistics.median(b for _, b in pairs),
                       "ratio": ratio, "met": ratio <= STEP_TARGET}
        print(f"decode step at batch {c}: engine {res[str(c)]['engine_ms']:.2f} ms, generate() "
              f"{res[str(c)]['generate_ms']:.2f} ms, ratio {ratio:.2f} (target <= {STEP_TARGET})", flush=True)
    return res


def small_budget(hf, base: list[str]) -> dict:
    from batchlab.run.config import load_config
    from batchlab.run.point import run_point
    budget = 4 * 600 * hf.kv_bytes_per_token
    cfg = load_config(None, base + [f"backend.memory_budget_bytes={budget}", "strategies=[dynamic,continuous]",
                                    "dynamic.max_batch_size=16", "dynamic.max_wait_ms=50", "traffic.rates=[200]",
                                    "traffic.arrival=constant", "traffic.duration_s=0.1", "traffic.warmup_s=0",
                                    "traffic.prompt_len={dist: uniform, low: 64, high: 512}", "traffic.output_len=32"])
    saved, hf.cfg = hf.cfg, cfg.backend
    res = {"budget_bytes": budget}
    try:
        for strategy in ("dynamic", "continuous"):
            r = run_point(cfg, strategy, 200.0, 0, hf)
            res[strategy] = {"requests": len(r.requests), "failed": int(r.summary["failed"]),
                             "triggers": dict(Counter(str(q.trigger) for q in r.requests)),
                             "preemptions": sum(q.num_preemptions for q in r.requests),
                             "peak_mem_bytes": r.meta.get("peak_mem_bytes")}
            print(f"small budget ({budget / MiB:.0f} MiB of KV), {strategy}: {res[strategy]}", flush=True)
    finally:
        hf.cfg = saved
    res["met"] = bool(res["dynamic"]["triggers"].get("memory") and res["dynamic"]["failed"] == 0
                      and res["continuous"]["failed"] == 0)
    return res


def real_oom(hf, base: list[str], torch) -> dict:
    from batchlab.core.clock import RealClock
    from batchlab.core.traffic import TraceItem, make_requests
    from batchlab.run.config import load_config
    from batchlab.run.driver import Inbox, drive
    from batchlab.schedulers import Given, make_scheduler
    dev = hf.loaded.device
    trace = [TraceItem(0.0, 1016 + i % 9, 8) for i in range(64)]   # unequal lengths: padded, like real traffic
    sizes, errors = [], []
    generate = hf._generate

    def watched(reqs, stamper):
        sizes.append(len(reqs))
        try:
            return generate(reqs, stamper)
        except torch.OutOfMemoryError as e:
            errors.append(" ".join(str(e).split())[:300])
            raise
    hf._generate = watched
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(dev).total_memory
    cap = torch.cuda.memory_reserved(dev) + 4 * GiB
    torch.cuda.set_per_process_memory_fraction(cap / total, dev)
    res = {"allocator_cap_bytes": cap, "prompt_tokens": [t.prompt_len for t in trace[:9]]}
    try:
        for strategy, knob in (("dynamic", "dynamic.max_batch_size=64"), ("naive", "naive.batch_size=64")):
            sizes.clear()
            errors.clear()
            cfg = load_config(None, base + [knob, "dynamic.max_wait_ms=1000"])
            clock = RealClock()

            async def main():
                sched = make_scheduler(strategy, cfg, Given(hf.facts().memory))
                reqs = make_requests(trace, clock.now(), hf.prepare)
                await drive(sched, hf, clock, Inbox(reqs))
                return sched, reqs
            sched, reqs = clock.run(main())
            failed = [r for r in reqs if r.error]
            res[strategy] = {"batch_sizes_tried": list(sizes), "ooms": len(errors), "first_oom": errors[0] if errors else None,
                             "failed": len(failed), "final_cap": getattr(sched, "cap", None),
                             "first_failure": failed[0].error[:300] if failed else None}
            print(f"real out-of-memory, {strategy}: {res[strategy]}", flush=True)
    finally:
        hf._generate = generate
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
    d, n = res["dynamic"], res["naive"]
    res["met"] = bool(d["ooms"] and d["failed"] == 0 and d["final_cap"] < 64 and n["failed"] == 64 and n["ooms"])
    return res


def ratios_stage(args) -> dict:
    from batchlab.backends.cost import StepCost
    from batchlab.backends.presets import load_cost, preset_kind, term_ratios
    est = load_cost(args.preset)
    out = {"preset": args.preset, "preset_kind": preset_kind(est), "profiles": {}}
    for p in args.profiles:
        data = json.loads(Path(p).read_text())
        ratios = term_ratios(est, StepCost.from_json(p))
        out["profiles"][Path(p).name] = {"level": data.get("level"), "fit_rms_rel_error": data.get("rms_rel_error"),
                                         "terms": ratios}
        print(f"{Path(p).name} ({data.get('level')}-level) against {args.preset} ({out['preset_kind']}):")
        for k, v in ratios.items():
            ratio = "n/a (estimate 0)" if v["ratio"] is None else f"{v['ratio']:.2f}x"
            print(f"  {k:20s} estimate {v['estimate']:.3e}  measured {v['measured']:.3e}  measured/estimate {ratio}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="stage", required=True)
    e = sub.add_parser("engine")
    e.add_argument("--model", default="random:mistral-7b")
    e.add_argument("--device", default="cuda")
    e.add_argument("--dtype", default="float16")
    e.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    e.add_argument("--repeats", type=int, default=3)
    e.add_argument("--out", required=True)
    r = sub.add_parser("ratios")
    r.add_argument("--preset", default="mistral-7b-h200")
    r.add_argument("--out", required=True)
    r.add_argument("profiles", nargs="+")
    args = ap.parse_args()
    result = engine_stage(args) if args.stage == "engine" else ratios_stage(args)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
