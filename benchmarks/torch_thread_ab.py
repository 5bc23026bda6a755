"""The step engine's decode pass with all torch work on one thread, against the model set up on
one thread and run on another (backends/torch_thread.py says why the two differ).

Each sample is a fresh spawned process (which threads have started OpenMP teams is a property of
the process, and it sticks): the tiny model in float32, a C-row decode plan (96-token prompts
prefilled first), then --passes decode passes timed one by one; the sample is their median.
  - one:   loading, the prefill and every pass on the torch thread, the event loop waiting
           (what the engine does now);
  - split: loading and the prefill on the main thread, the passes through asyncio.to_thread
           (what the engine did before: the passes on whichever pool thread is free).
Layouts alternate (one, split; split, one; ...), --repeats samples each; reported per C: each
layout's median, and split / one as the median of the paired ratios with its range, the
machine's load beside it.
Usage: python benchmarks/torch_thread_ab.py [--concurrency 16 64] [--repeats 5] [--passes 200] [--json PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

LAYOUTS = ("one", "split")


def _setup(rows: int):
    """The tiny model's engine and a `rows`-row decode plan; returns one decode pass as a function."""
    import torch
    from transformers import AutoModelForCausalLM

    from batchlab.backends.hf_engine import StepEngine
    from batchlab.backends.hf_slots import ATTN_NAME, attention
    from batchlab.backends.tiny import ensure_tiny_model
    from batchlab.core.request import Request
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32).eval()
    engine = StepEngine(model)
    g = torch.Generator().manual_seed(3)
    reqs = [Request(f"r{i}", 96, 4, 0.0, index=i, prompt_token_ids=torch.randint(10, 300, (96,), generator=g).tolist())
            for i in range(rows)]
    with torch.inference_mode(), attention(model, ATTN_NAME):
        engine.forward(engine._plan([(r, r.prompt_len) for r in reqs]))
        for r in reqs:
            r.num_computed_tokens = r.prompt_len
            r.output_token_ids.append(5)
        plan = engine._plan([(r, 1) for r in reqs])

    def one_pass() -> list[int]:
        with torch.inference_mode(), attention(model, ATTN_NAME):
            return engine.forward(plan).argmax(-1).tolist()
    return one_pass


def sample(layout: str, rows: int, passes: int) -> float:
    """In a fresh process: the median decode pass (seconds) under `layout`."""
    from batchlab.backends import torch_thread

    async def main() -> float:
        if layout == "one":
            one_pass = await torch_thread.run(_setup, rows)
            go = lambda: torch_thread.run(one_pass)           # noqa: E731
        else:
            one_pass = _setup(rows)
            go = lambda: asyncio.to_thread(one_pass)           # noqa: E731
        times = []
        for _ in range(passes):
            t0 = time.perf_counter()
            await go()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--passes", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    load_before, spawn = os.getloadavg(), multiprocessing.get_context("spawn")
    levels = []
    for c in args.concurrency:
        runs = {k: [] for k in LAYOUTS}
        for k in range(args.repeats):
            for layout in (LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]):
                with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                    runs[layout].append(pool.submit(sample, layout, c, args.passes).result())
                print(f"C={c:3d} repeat {k}: {layout:5s} {1e3 * runs[layout][-1]:.2f} ms", flush=True)
        ratios = [s / o for s, o in zip(runs["split"], runs["one"])]
        levels.append({"concurrency": c, "pass_ms": {k: 1e3 * statistics.median(v) for k, v in runs.items()},
                       "pass_ms_per_repeat": {k: [1e3 * x for x in v] for k, v in runs.items()},
                       "split_over_one": statistics.median(ratios), "split_over_one_per_repeat": ratios})
    import torch
    record = {"command": "python benchmarks/torch_thread_ab.py --concurrency " + " ".join(map(str, args.concurrency))
              + f" --repeats {args.repeats} --passes {args.passes}" + (f" --json {args.json}" if args.json else ""),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "levels": levels}
    for lv in levels:
        print(f"C={lv['concurrency']}: one thread {lv['pass_ms']['one']:.2f} ms, split {lv['pass_ms']['split']:.2f} ms, "
              f"split / one {lv['split_over_one']:.2f}x")
    if args.json:
        from batchlab.core.files import write_atomic
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
