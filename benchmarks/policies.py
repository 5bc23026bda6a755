"""The policy lab's two questions, on the simulator and on the tiny HF model, with the same code.

1. Shortest-job-first vs FCFS (continuous batching) on a bimodal output mix, at 90 % of FCFS
   continuous batching's capacity: mean and p99 E2E of SJF with the true lengths (oracle) and
   with a noisy predictor (mean absolute relative error 50 %), and the share of the oracle's gain
   in mean E2E that survives the noise. Target: mean E2E >= 30 % lower, p99 <= 1.2x.
2. VTC vs FCFS with one tenant sending 4x as much as the other: the well-behaved (light)
   tenant's p99 TTFT under each, beside its solo run (the same light requests, heavy removed).
   Light sends 40 % of capacity, heavy 160 %: together 2x what the engine can serve.
   Target: light's p99 TTFT under VTC within 1.5x of solo.

Workload (traffic.classes, one config for both backends): 32-token prompts; SJF mix `short`
(80 %, output lognormal median 16, 4-64) and `long` (20 %, median 192, 96-384); VTC tenants both
output lognormal median 32 (8-128). Continuous batching with max_num_seqs 8 for SJF, so a queue
forms below the memory limits (the regime where the order of admission matters), and 64 for VTC,
so a slot frees every step or two and a tenant's wait is set by the policy, not by slot turnover.
Capacity: requests/s FCFS continuous batching completes in the steady middle of a burst that
arrives at once (batchlab/tune/burst.py, the package's one burst: the queue never empties, so it is
the most the engine serves with this mix), measured per backend. Each repeat is a trace
of its own seed, every policy on the same trace, the order rotating across repeats; medians over
repeats, per-repeat values in the JSON.
Usage: python benchmarks/policies.py [--repeats 3] [--skip-hf] [--hf-duration 30] [--json docs/results/policies.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from batchlab.backends import make_backend
from batchlab.core.metrics import latencies, measured, per_request, percentile
from batchlab.core.traffic import build_trace
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config
from batchlab.run.point import run_point
from batchlab.tune.burst import saturated

SJF_TARGET, P99_LIMIT, VTC_LIMIT = 0.30, 1.2, 1.5
SEQS = 8                        # SJF: few slots, so a queue forms
VTC_SEQS = 64                   # VTC: many slots, so one frees every step or two
SJF_CLASSES = ("traffic.classes=[{name: short, weight: 4, output_len: {dist: lognormal, median: 16, low: 4, high: 64}},"
               " {name: long, weight: 1, output_len: {dist: lognormal, median: 192, sigma: 0.3, low: 96, high: 384}}]")
VTC_CLASSES = ("traffic.classes=[{name: light, weight: 1, tenant: light}, {name: heavy, weight: 4, tenant: heavy}]")
VTC_LENGTH = "traffic.output_len={dist: lognormal, median: 32, low: 8, high: 128}"
BACKENDS = {
    "sim": ["backend.kind=sim"],
    "hf": ["backend.kind=hf", "backend.model=tiny", "backend.device=cpu", "backend.dtype=float32",
           "backend.threads=1", "backend.warmup_batches=1"],
}


def config(kind: str, duration: float, warmup: float, *sets: str, seqs: int = SEQS):
    return load_config(None, [*BACKENDS[kind], "traffic.prompt_len=32", f"continuous.max_num_seqs={seqs}",
                              f"traffic.duration_s={duration}", f"traffic.warmup_s={warmup}", "traffic.rates=[1]",
                              "sjf.aging_s=10", *sets])


def e2e_stats(requests, warmup: float) -> dict:
    m = measured(requests, warmup)
    e2e = np.array([latencies(r)["e2e"] for r in m])             # a failed request: inf
    out = {"requests": len(m), "failed": int(np.isinf(e2e).sum()), "e2e_mean_s": float(e2e.mean()),
           "e2e_p99_s": float(percentile(e2e, 99))}
    for k in sorted({r.klass for r in m}):
        mine = np.array([v for v, r in zip(e2e, m) if r.klass == k])
        out[f"e2e_mean_s_{k}"] = float(mine.mean())
    return out


def ttft_p99(requests, warmup: float, tenant: str) -> float:
    m = [r for r in measured(requests, warmup) if r.tenant == tenant]
    return float(percentile(np.array([latencies(r)["ttft"] for r in m]), 99))


def light_tpot(requests, warmup: float) -> float:
    """p50 TPOT of the light tenant's finished requests: the step time its batch runs at."""
    tpots = (per_request(r)["tpot"] for r in measured(requests, warmup) if r.tenant == "light")
    return float(np.median([t for t in tpots if t is not None]))


def sjf_part(kind: str, repeats: int, duration: float, warmup: float, burst: int) -> dict:
    base = config(kind, duration, warmup, SJF_CLASSES)
    backend = make_backend(base)
    cap = saturated(base, "continuous", backend, burst)
    rate = 0.9 * cap
    print(f"[{kind}] SJF: capacity {cap:.2f} req/s, running at {rate:.2f}", flush=True)
    sides = {"fcfs": ("continuous", base), "sjf_oracle": ("sjf", base),
             "sjf_noisy": ("sjf", config(kind, duration, warmup, SJF_CLASSES, "sjf.predictor=noisy", "sjf.error=0.5"))}
    runs = []
    for k in range(repeats):
        trace = build_trace(base.traffic, rate, k)
        names = list(sides)
        names = names[k % 3:] + names[:k % 3]            # rotate the order across repeats
        res = {}
        for name in names:
            strategy, cfg = sides[name]
            res[name] = e2e_stats(run_point(cfg, strategy, rate, k, backend, trace).requests, warmup)
        runs.append({"seed_repeat": k, **res})
        print(f"[{kind}] repeat {k}: mean E2E fcfs {res['fcfs']['e2e_mean_s']:.3f} s, sjf {res['sjf_oracle']['e2e_mean_s']:.3f} s, "
              f"noisy {res['sjf_noisy']['e2e_mean_s']:.3f} s; p99 fcfs {res['fcfs']['e2e_p99_s']:.3f}, "
              f"sjf {res['sjf_oracle']['e2e_p99_s']:.3f}", flush=True)
    med = lambda side, key: statistics.median(r[side][key] for r in runs)   # noqa: E731
    f, o, n = (med(s, "e2e_mean_s") for s in ("fcfs", "sjf_oracle", "sjf_noisy"))
    gain = [1 - r["sjf_oracle"]["e2e_mean_s"] / r["fcfs"]["e2e_mean_s"] for r in runs]
    kept = [(r["fcfs"]["e2e_mean_s"] - r["sjf_noisy"]["e2e_mean_s"]) / (r["fcfs"]["e2e_mean_s"] - r["sjf_oracle"]["e2e_mean_s"])
            for r in runs]
    p99 = [r["sjf_oracle"]["e2e_p99_s"] / r["fcfs"]["e2e_p99_s"] for r in runs]
    return {"capacity_req_s": cap, "rate_req_s": rate, "burst": burst, "duration_s": duration, "warmup_s": warmup,
            "aging_s": base.sjf.aging_s, "runs": runs,
            "mean_e2e_s": {"fcfs": f, "sjf_oracle": o, "sjf_noisy": n},
            "mean_e2e_cut_per_repeat": gain, "mean_e2e_cut": statistics.median(gain),
            "p99_ratio_per_repeat": p99, "p99_ratio": statistics.median(p99),
            "noisy_gain_kept_per_repeat": kept, "noisy_gain_kept": statistics.median(kept),
            "targets_met": statistics.median(gain) >= SJF_TARGET and statistics.median(p99) <= P99_LIMIT}


def vtc_part(kind: str, repeats: int, duration: float, warmup: float, burst: int) -> dict:
    base = config(kind, duration, warmup, VTC_CLASSES, VTC_LENGTH, seqs=VTC_SEQS)
    backend = make_backend(base)
    cap = saturated(base, "continuous", backend, burst)
    rate = 2.0 * cap                                    # light 0.4 cap + heavy 1.6 cap
    print(f"[{kind}] VTC: capacity {cap:.2f} req/s; light {0.2 * rate:.2f}, heavy {0.8 * rate:.2f} req/s", flush=True)
    runs = []
    for k in range(repeats):
        trace = build_trace(base.traffic, rate, k)
        solo = [t for t in trace if t.tenant == "light"]
        res = {}
        for name in ["solo", "fcfs", "vtc"][k % 3:] + ["solo", "fcfs", "vtc"][:k % 3]:
            strategy = "vtc" if name == "vtc" else "continuous"
            reqs = run_point(base, strategy, rate, k, backend, solo if name == "solo" else trace).requests
            res[name] = {"light_ttft_p99_s": ttft_p99(reqs, warmup, "light"),
                         "heavy_ttft_p99_s": ttft_p99(reqs, warmup, "heavy") if name != "solo" else None}
        runs.append({"seed_repeat": k, **res})
        print(f"[{kind}] repeat {k}: light p99 TTFT solo {res['solo']['light_ttft_p99_s']:.3f} s, "
              f"fcfs {res['fcfs']['light_ttft_p99_s']:.3f} s, vtc {res['vtc']['light_ttft_p99_s']:.3f} s", flush=True)
    ratio = lambda side: [r[side]["light_ttft_p99_s"] / r["solo"]["light_ttft_p99_s"] for r in runs]   # noqa: E731
    return {"capacity_req_s": cap, "rate_req_s": rate, "light_req_s": 0.2 * rate, "heavy_req_s": 0.8 * rate,
            "duration_s": duration, "warmup_s": warmup, "runs": runs,
            "light_p99_ttft_vs_solo": {"fcfs": statistics.median(ratio("fcfs")), "vtc": statistics.median(ratio("vtc"))},
            "per_repeat": {"fcfs": ratio("fcfs"), "vtc": ratio("vtc")},
            "target_met": statistics.median(ratio("vtc")) <= VTC_LIMIT}


def vtc_light_loads(repeats: int, duration: float, warmup: float, cap: float) -> list[dict]:
    """Simulator only: light's p99 TTFT under VTC over solo as light's own load varies, heavy at
    twice capacity (4x a fair share): where the policy's cost ends and the shared batch's begins."""
    out = []
    for light in (0.1, 0.25, 0.4):
        heavy = 2.0
        classes = (f"traffic.classes=[{{name: light, weight: {light}, tenant: light}}, "
                   f"{{name: heavy, weight: {heavy}, tenant: heavy}}]")
        base = config("sim", duration, warmup, classes, VTC_LENGTH, seqs=VTC_SEQS)
        backend = make_backend(base)
        rate = (light + heavy) * cap
        ratios, tpots = [], []
        for k in range(repeats):
            trace = build_trace(base.traffic, rate, k)
            alone = run_point(base, "continuous", rate, k, backend, [t for t in trace if t.tenant == "light"]).requests
            shared = run_point(base, "vtc", rate, k, backend, trace).requests
            ratios.append(ttft_p99(shared, warmup, "light") / ttft_p99(alone, warmup, "light"))
            tpots.append(light_tpot(shared, warmup) / light_tpot(alone, warmup))
        out.append({"light_share_of_capacity": light, "heavy_share_of_capacity": heavy,
                    "vtc_over_solo_per_repeat": ratios, "vtc_over_solo": statistics.median(ratios),
                    "light_p50_tpot_vtc_over_solo_per_repeat": tpots})
        print(f"[sim] VTC, light at {light:.0%} of capacity, heavy at {heavy:.0%}: light p99 TTFT "
              f"x{statistics.median(ratios):.2f} solo", flush=True)
    return out


def agreement(out: dict) -> dict | None:
    """Do the simulator and the HF engine agree in ranking and direction?"""
    if "hf" not in out:
        return None
    s, h = out["sim"], out["hf"]
    order = lambda part: sorted(part["mean_e2e_s"], key=part["mean_e2e_s"].get)   # noqa: E731
    return {"sjf_mean_e2e_ranking": {"sim": order(s["sjf"]), "hf": order(h["sjf"]),
                                     "same": order(s["sjf"]) == order(h["sjf"])},
            "vtc_helps_light_tenant": {"sim": s["vtc"]["light_p99_ttft_vs_solo"]["vtc"] < s["vtc"]["light_p99_ttft_vs_solo"]["fcfs"],
                                       "hf": h["vtc"]["light_p99_ttft_vs_solo"]["vtc"] < h["vtc"]["light_p99_ttft_vs_solo"]["fcfs"]},
            "sjf_cuts_mean_e2e": {"sim": s["sjf"]["mean_e2e_cut"] > 0, "hf": h["sjf"]["mean_e2e_cut"] > 0}}


@user_errors
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sim-duration", type=float, default=300.0, help="seconds of simulated traffic per point after warm-up")
    ap.add_argument("--hf-duration", type=float, default=30.0,
                    help="seconds of real traffic per HF point after warm-up (VTC: half, since its overload drains after)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--only-hf", action="store_true",
                    help="rerun the HF part only, keeping the simulator's figures already in --json (a quieter machine)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    load0 = list(os.getloadavg())
    out: dict = {"command": "python benchmarks/policies.py " + " ".join(sys.argv[1:]),
                 "max_num_seqs": {"sjf": SEQS, "vtc": VTC_SEQS},
                 "targets": {"sjf_mean_e2e_cut": SJF_TARGET, "sjf_p99_ratio": P99_LIMIT, "vtc_light_vs_solo": VTC_LIMIT}}
    t = time.perf_counter()
    if a.only_hf:
        if not (a.json and a.json.is_file()):
            raise ConfigError("--only-hf needs --json naming a result file that has the simulator's part")
        old = json.loads(a.json.read_text())
        out["sim"] = old["sim"]
        out["command"] = old["command"] + f"; HF part rerun: {out['command']}"
    else:
        out["sim"] = {"sjf": sjf_part("sim", a.repeats, a.sim_duration, 20.0, 2000),
                      "vtc": vtc_part("sim", a.repeats, a.sim_duration, 20.0, 2000)}
        out["sim"]["vtc_light_loads"] = vtc_light_loads(a.repeats, a.sim_duration, 20.0,
                                                        out["sim"]["vtc"]["capacity_req_s"])
        out["sim"]["wall_s"] = time.perf_counter() - t
    if not a.skip_hf:
        t = time.perf_counter()
        out["hf"] = {"sjf": sjf_part("hf", a.repeats, a.hf_duration, 5.0, 300),
                     "vtc": vtc_part("hf", a.repeats, a.hf_duration / 2, 5.0, 600)}
        out["hf"]["wall_s"] = time.perf_counter() - t
        out["agreement"] = agreement(out)
    out["load_avg_1_5_15"] = {"before": load0, "after": list(os.getloadavg())}
    out["cpus"] = os.cpu_count()
    for kind in ("sim", "hf"):
        if kind in out:
            s, v = out[kind]["sjf"], out[kind]["vtc"]
            print(f"{kind}: SJF cut mean E2E by {s['mean_e2e_cut']:.0%} (target {SJF_TARGET:.0%}), p99 x{s['p99_ratio']:.2f} "
                  f"(limit {P99_LIMIT}); noisy predictor kept {s['noisy_gain_kept']:.0%} of the gain; light tenant p99 TTFT "
                  f"vs solo: VTC x{v['light_p99_ttft_vs_solo']['vtc']:.2f}, FCFS x{v['light_p99_ttft_vs_solo']['fcfs']:.2f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
