"""The four-strategy experiment's deliverable from one results directory, as a result file the README renders: the
verdict's first line (what each strategy sustains under the SLO), the filled-in sentence (dynamic
against naive, at the rate the verdict names), the four hypotheses answered from the run, one row
per strategy and rate (medians over repeats), and two of the report's plots copied beside it.

The results directory is what `batchlab run configs/plan-cpu.yaml` wrote; its report is rebuilt
here from its CSV files, so every figure comes from them.
Usage: python benchmarks/plan_result.py results/plan-cpu --json docs/results/plan_cpu.json
       [--plots docs/results/plan-cpu]
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

from batchlab.core.files import write_atomic
from batchlab.report import capacity, fmt, hypotheses, stats
from batchlab.report.load import load_requests, load_results
from batchlab.report.report import build_report

PLOTS = ("tradeoff.png", "latency_vs_rate.png")
COLUMNS = ("throughput_tok_s", "requests_per_s", "ttft_p50", "ttft_p99", "tpot_p50", "e2e_p99", "slo_attainment", "failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--plots", type=Path, default=None, help="Copy the report's main plots here.")
    ap.add_argument("--run", default="batchlab run configs/plan-cpu.yaml", help="The command that made the results.")
    args = ap.parse_args()
    summary, setup, config = load_results(args.results)
    requests = load_requests(args.results)
    _, lines = build_report(args.results)
    slo = {k: v for k, v in (config.get("slo") or {}).items() if v}
    with fmt.rate_unit(fmt.unit_of(config.get("traffic"))):
        caps = capacity.capacities(summary, requests, slo)
        answered = hypotheses.hypotheses(summary, caps, lines)
    med = stats.medians(summary)
    sentence = next((x for x in lines if x.startswith("Dynamic batching") and "naive" in x), None)
    plots = []
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
        for name in PLOTS:
            if (args.results / name).is_file():
                shutil.copyfile(args.results / name, args.plots / name)
                plots.append(str(args.plots / name))
    out = {"command": "python benchmarks/plan_result.py " + shlex.join(sys.argv[1:]),
           "run": args.run,
           "config": {k: config.get(k) for k in ("backend", "strategies", "naive", "dynamic", "continuous",
                                                  "baselines", "traffic", "slo")},
           "setup": {k: setup.get(k) for k in ("model", "device", "dtype", "params", "torch", "transformers", "machine",
                                               "baselines", "started_utc")},
           "repeats": int(summary["repeat"].max()) + 1,
           "verdict": lines[0], "sentence": sentence,
           "capacity": {s: {"rate": c.rate, "highest_tried": c.highest_tried, "broke_at": c.broke_at, "limit": list(c.limit)}
                        for s, c in caps.items()},
           "hypotheses": [{"hypothesis": h, "answer": a, "figures": f} for h, a, f in answered],
           "points": [{"strategy": r["strategy"], "rate": float(r["rate"]), **{k: float(r[k]) for k in COLUMNS}}
                      for _, r in med.iterrows()],
           "plots": plots}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.json, json.dumps(out, indent=2, default=str) + "\n")
    print(lines[0])
    print(sentence)
    for h, a, _ in answered:
        print(f"{a:>15}  {h}")


if __name__ == "__main__":
    main()
