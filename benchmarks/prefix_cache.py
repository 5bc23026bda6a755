"""Prefix caching on a shared-prefix workload: p50 TTFT with and without it, simulator and HF engine;
then 4 simulated replicas behind the cache-aware router vs least-outstanding.

Workload: 8 system prompts of 1,024 tokens, each request one of them (uniform, seeded) plus a
64-token user message of its own, 32 output tokens, Poisson arrivals. Continuous batching with
default knobs (block 16 tokens, 8,192 batched tokens, 256 sequences), caching off vs on.
Capacity (without caching), measured first:
  - simulator (llama2-7b-a100 preset): the package's search on the Poisson rate (core/search.py,
    from [1, 200] req/s to within 1 %), 60 s points after a 10 s warm-up, each judged by the one
    rule (core/sustain.py judge: nothing failed, >= 95 % of the window's work served, no growing
    queue, below what a burst of 8 full batches completes saturated);
  - HF engine (tiny model, CPU): requests/s over the whole span of a burst of --burst requests
    arriving at once (core/sustain.py makespan_rate: a burst of about one batch).
Each part then runs at 80 % of its own capacity, repeats = traces of different seeds, caching off
and on over the same trace (order alternating). The HF trace is also replayed on the simulator
(same arrivals, same prompts) to compare hit rates: they are bookkeeping of the same scheduler.
Replicas: 4 x the simulator, rate 80 % of 4 x one replica's capacity, caching on everywhere.
Usage: python benchmarks/prefix_cache.py [--repeats 3] [--hf-duration 30] [--json docs/results/prefix_cache.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np

from batchlab.backends.presets import load_cost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.core.clock import RealClock, VirtualClock
from batchlab.core.metrics import measured, prefix_cache, summarize
from batchlab.core.request import Request
from batchlab.core.search import knee
from batchlab.core.sustain import judge, makespan_rate, saturated_rate
from batchlab.errors import RunFailed, user_errors
from batchlab.run.config import load_config
from batchlab.run.driver import Inbox, drive
from batchlab.run.replicas import make_replicas, serve_replicated
from batchlab.run.router import ROUTERS
from batchlab.schedulers import ContinuousConfig
from batchlab.schedulers.continuous import ContinuousScheduler
from batchlab.tune.burst import burst_size

GROUPS, SYSTEM, USER, OUTPUT, BLOCK = 8, 1024, 64, 32, 16
SIM_WARMUP, SIM_DURATION = 10.0, 60.0   # each simulated point: seconds of warm-up, then measured
TARGET = 2.0                      # TTFT cut, p50 without / with caching
VOCAB = (10, 2000)                # ordinary token ids of the tiny model (no specials)


def workload(rate: float, duration: float, seed: int) -> list[Request]:
    """Poisson arrivals; prompt = one of GROUPS system prompts (fixed across seeds) + a user message."""
    systems = np.random.default_rng(1234).integers(*VOCAB, size=(GROUPS, SYSTEM))
    rng = np.random.default_rng(seed)
    t, reqs = 0.0, []
    while True:
        t += rng.exponential(1 / rate)
        if t >= duration:
            return reqs
        ids = systems[rng.integers(GROUPS)].tolist() + rng.integers(*VOCAB, size=USER).tolist()
        reqs.append(Request(f"r{len(reqs):05d}", len(ids), OUTPUT, t, index=len(reqs), prompt_token_ids=ids))


def fresh(reqs: list[Request], t0: float = 0.0) -> list[Request]:
    """Unrun copies (same arrivals and prompts), arriving t0 later."""
    return [Request(r.request_id, r.prompt_len, r.max_new_tokens, r.arrival_time + t0, index=r.index,
                    prompt_token_ids=r.prompt_token_ids) for r in reqs]


def point(reqs: list[Request], warmup: float, t0: float = 0.0) -> dict:
    for r in reqs:                                     # seconds from the trace's start
        r.arrival_time -= t0
        r.scheduled_time = None if r.scheduled_time is None else r.scheduled_time - t0
        r.token_times[:] = [x - t0 for x in r.token_times]
    m = measured(reqs, warmup)
    s = summarize(m)
    qw = sorted(x.scheduled_time - x.arrival_time for x in m if x.scheduled_time is not None)
    return {"ttft_p50_s": s["ttft_p50"], "ttft_p90_s": s["ttft_p90"], "requests": len(m), "finished": s["finished"],
            "queue_wait_p90_s": qw[int(0.9 * (len(qw) - 1))] if qw else float("nan"), **prefix_cache(m, BLOCK)}


def simulate(reqs: list[Request], caching: bool, cost) -> list[Request]:
    cfg = ContinuousConfig(block_size=BLOCK, prefix_caching=caching)
    backend = SimulatedBackend(cost)
    sched = ContinuousScheduler(cfg, backend.facts().num_kv_blocks(BLOCK), windows=True, finish_in_window=True)
    reqs = fresh(reqs)
    clock = VirtualClock()
    clock.run(drive(sched, backend, clock, Inbox(reqs)))
    return reqs


def sim_run(reqs: list[Request], caching: bool, warmup: float, cost) -> dict:
    reqs = simulate(reqs, caching, cost)
    return point(reqs, warmup) | {"cached_tokens_per_request": [r.num_cached_tokens for r in reqs]}


def burst(n: int, seed: int) -> list[Request]:
    """The workload's first n requests, all arriving at once (a queue that never empties)."""
    reqs = workload(1000.0, 1.0 + 1.5 * n / 1000.0, seed)[:n]
    for r in reqs:
        r.arrival_time = 0.0
    return reqs


def sim_capacity(cost) -> float:
    """The highest Poisson rate the simulator sustains without caching (see the module docstring)."""
    cfg = load_config(None, [f"continuous.block_size={BLOCK}"])
    saturated = saturated_rate(simulate(burst(burst_size(cfg, "continuous"), seed=998), False, cost))
    end = SIM_WARMUP + SIM_DURATION

    def holds(rate: float) -> bool:
        reqs = simulate(workload(rate, end, seed=999), False, cost)
        return judge(reqs, SIM_WARMUP, end, rate=rate, saturated=saturated).sustained

    found = knee(holds, 1.0, 200.0, tolerance=0.01)
    if found.lo is None:
        raise RunFailed(f"the simulator sustains none of the rates tried ({found.probes})")
    return found.lo


def ttft_cut(runs: list[dict]) -> list[float]:
    return [r["off"]["ttft_p50_s"] / r["on"]["ttft_p50_s"] for r in runs]


def simulator_part(cost, repeats: int) -> dict:
    cap = sim_capacity(cost)
    rate = 0.8 * cap
    runs = []
    for k in range(repeats):
        reqs = workload(rate, SIM_WARMUP + SIM_DURATION, seed=k)
        runs.append({"seed": k, "off": sim_run(reqs, False, SIM_WARMUP, cost), "on": sim_run(reqs, True, SIM_WARMUP, cost)})
        for side in ("off", "on"):
            runs[-1][side].pop("cached_tokens_per_request")
        print(f"sim seed {k}: p50 TTFT off {runs[-1]['off']['ttft_p50_s']:.3f} s, on {runs[-1]['on']['ttft_p50_s']:.3f} s, "
              f"hit {runs[-1]['on']['prefix_hit_rate_tokens']:.3f}", flush=True)
    return {"capacity_req_s": cap, "rate_req_s": rate, "duration_s": SIM_DURATION, "warmup_s": SIM_WARMUP, "runs": runs,
            "ttft_cut_per_repeat": ttft_cut(runs)}


async def hf_serve(hf, reqs: list[Request], caching: bool, clock) -> tuple[list[Request], float]:
    """Unrun copies of `reqs`, arriving from now, through a fresh engine (no K/V kept from the last
    run); returns them and the time they started from."""
    cfg = ContinuousConfig(block_size=BLOCK, prefix_caching=caching)
    hf.engine = None
    sched = ContinuousScheduler(cfg, hf.facts().num_kv_blocks(BLOCK), windows=True, finish_in_window=True)
    t0 = clock.now()
    reqs = fresh(reqs, t0)
    for r in reqs:
        hf.prepare(r)
    await drive(sched, hf, clock, Inbox(reqs))
    return reqs, t0


async def hf_run(hf, reqs: list[Request], caching: bool, warmup: float, clock) -> dict:
    reqs, t0 = await hf_serve(hf, reqs, caching, clock)
    return point(reqs, warmup, t0) | {"cached_tokens_per_request": [r.num_cached_tokens for r in reqs]}


def hf_part(repeats: int, burst: int, duration: float, threads: int | None, cost) -> dict:
    import torch

    from batchlab.backends.hf import HFOptions
    from batchlab.backends.hf_backend import HFBackend
    if threads:
        torch.set_num_threads(threads)
    hf = HFBackend(HFOptions(model="tiny", device="cpu", dtype="float32", warmup_batches=1), warmup_shape=(8, 64, 8))
    clock = RealClock()
    warmup = 5.0

    cap = clock.run(_saturation(hf, burst, clock))
    rate = 0.8 * cap
    print(f"hf capacity (saturated burst of {burst}): {cap:.2f} req/s; running at {rate:.2f}", flush=True)
    runs = []
    for k in range(repeats):
        reqs = workload(rate, warmup + duration, seed=100 + k)
        order = [False, True] if k % 2 == 0 else [True, False]
        res = {}
        for caching in order:
            res["on" if caching else "off"] = clock.run(hf_run(hf, reqs, caching, warmup, clock))
        sim = sim_run(reqs, True, warmup, cost)
        res["sim_same_trace_hit_rate_tokens"] = sim["prefix_hit_rate_tokens"]
        res["sim_same_trace_hit_rate_blocks"] = sim["prefix_hit_rate_blocks"]
        res["sim_same_trace_same_hits_per_request"] = sim["cached_tokens_per_request"] == res["on"]["cached_tokens_per_request"]
        for side in ("off", "on"):
            res[side].pop("cached_tokens_per_request")
        runs.append({"seed": 100 + k, **res})
        print(f"hf seed {100 + k}: p50 TTFT off {res['off']['ttft_p50_s']:.3f} s, on {res['on']['ttft_p50_s']:.3f} s, "
              f"hit {res['on']['prefix_hit_rate_tokens']:.4f} (sim on the same trace {sim['prefix_hit_rate_tokens']:.4f})",
              flush=True)
    return {"capacity_req_s": cap, "rate_req_s": rate, "duration_s": duration, "warmup_s": warmup, "burst": burst,
            "setup": hf.describe(), "torch_threads": torch.get_num_threads(), "runs": runs,
            "ttft_cut_per_repeat": ttft_cut(runs)}


async def _saturation(hf, n: int, clock) -> float:
    """Requests/s a burst of n requests (no caching) is served at: the engine's capacity."""
    await hf.start(clock)
    await hf_run(hf, workload(50.0, 0.2, seed=500), False, 0.0, clock)   # warm the engine
    reqs, _ = await hf_serve(hf, burst(n, seed=501), False, clock)
    return makespan_rate(reqs)


def replicas_part(cost, single_cap: float, repeats: int, kv_blocks: list[int | None]) -> dict:
    n, rate = 4, 0.8 * 4 * single_cap
    out = []
    for blocks in kv_blocks:
        sets = ["continuous.prefix_caching=true", f"continuous.block_size={BLOCK}", f"backend.replicas={n}"]
        if blocks:
            sets.append(f"continuous.num_kv_blocks={blocks}")
        cfg = load_config(None, sets)
        per = {}
        for router in ("least_outstanding", "cache_aware"):
            per[router] = []
            for k in range(repeats):
                reqs = workload(rate, SIM_WARMUP + SIM_DURATION, seed=200 + k)
                replicas = make_replicas(cfg, "continuous", SimulatedBackend(cost), n)
                clock = VirtualClock()
                clock.run(serve_replicated(reqs, replicas, ROUTERS[router](), clock))
                per[router].append(point(reqs, SIM_WARMUP))
            print(f"replicas kv_blocks={blocks or 'default'} {router}: p50 TTFT "
                  f"{statistics.median(p['ttft_p50_s'] for p in per[router]):.3f} s, hit "
                  f"{statistics.median(p['prefix_hit_rate_tokens'] for p in per[router]):.3f}", flush=True)
        out.append({"kv_blocks_per_replica": blocks or SimulatedBackend(cost).facts().num_kv_blocks(BLOCK), "routers": per})
    return {"replicas": n, "rate_req_s": rate, "slack": ROUTERS["cache_aware"].slack, "settings": out}


@user_errors
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hf-duration", type=float, default=30.0, help="seconds of traffic per HF run after warm-up")
    ap.add_argument("--burst", type=int, default=96, help="requests in the HF saturation burst")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--replica-kv-blocks", type=int, nargs="+", default=[0, 1200],
                    help="KV blocks per replica to compare routers at (0: the preset's memory)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", default="results/bench/prefix_cache.json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    cost = load_cost("llama2-7b-a100")
    sim = simulator_part(cost, args.repeats)
    reps = replicas_part(cost, sim["capacity_req_s"], args.repeats, [b or None for b in args.replica_kv_blocks])
    hf = None if args.skip_hf else hf_part(args.repeats, args.burst, args.hf_duration, args.threads, cost)
    command = " ".join(["python benchmarks/prefix_cache.py", f"--repeats {args.repeats}",
                        f"--hf-duration {args.hf_duration:g}", f"--burst {args.burst}",
                        *([f"--threads {args.threads}"] if args.threads else []),
                        f"--replica-kv-blocks {' '.join(map(str, args.replica_kv_blocks))}",
                        *(["--skip-hf"] if args.skip_hf else []), f"--json {args.json}"])
    data = {"command": command, "workload": {"system_prompts": GROUPS, "system_tokens": SYSTEM, "user_tokens": USER,
                                             "output_tokens": OUTPUT, "block_size": BLOCK},
            "target_ttft_cut": TARGET, "simulator": sim, "hf": hf, "replicas": reps,
            "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()}, "cpus": os.cpu_count()}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    for name, part in (("simulator", sim), ("hf", hf)):
        if part:
            c = part["ttft_cut_per_repeat"]
            print(f"{name}: p50 TTFT cut {statistics.median(c):.2f}x ({min(c):.2f}-{max(c):.2f}); target {TARGET}x: "
                  f"{'met' if statistics.median(c) >= TARGET else 'NOT met'}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
