"""Length-aware dynamic batching against plain dynamic batching, on the simulator, paired.

The same traffic (the default config's lengths: lognormal prompts and answers) at each rate, run
once with `dynamic.group_by_length` off and once on. Reported per rate: the useful decode share
sum(o) / (B x max o) and the prompt share that is not padding (generate() pads every row to the
batch's longest prompt and output), the mean batch, and the paired changes in p50 / p99 TTFT and
E2E and in throughput (batchlab compare's statistics: a block bootstrap over the requests of one
trace, or a t-interval over repeats).
Then, at the highest rate, the skip cap swept (`--skips`): how much grouping it allows against the
longest wait a request sees (max TTFT).
`--config` runs another config's backend and lengths (configs/smoke.yaml: the tiny model in real
time), `--set` overrides its keys.
Usage: python benchmarks/length_grouping.py [--config FILE] [--set KEY=VALUE ...] [--rates 20 30 40]
       [--skips 4 32 1000] [--duration 300] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from batchlab.report import stats
from batchlab.report import timeline as tl
from batchlab.report.compare import combined, load
from batchlab.report.load import load_requests, load_results
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

METRICS = ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "throughput_tok_s")


def skip_sweep(args, rate: float) -> list[dict]:
    """At one rate: plain, then grouped at each skip cap: useful decode, throughput, p99 and max TTFT."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for skips in [None, *args.skips]:
            sets = [f"traffic.rates=[{rate}]", f"traffic.duration_s={args.duration}", "strategies=[dynamic]", "report=false"]
            sets += ["dynamic.group_by_length=false"] if skips is None else ["dynamic.group_by_length=true",
                                                                            f"dynamic.max_skips={skips}"]
            d = run_sweep(load_user_config(args.config, [*args.set, *sets]), Path(tmp) / str(skips))
            summary, _, _ = load_results(d)
            requests = load_requests(d)
            m = requests[~requests["warmup"].astype(bool) & (requests["status"] == "finished")]
            w = tl.useful_work(tl.batches(m)).iloc[0]
            s = summary.iloc[0]
            out.append({"max_skips": skips, "useful_decode": float(w["useful_decode"]),
                        "throughput_tok_s": float(s["throughput_tok_s"]), "ttft_p99": float(s["ttft_p99"]),
                        "ttft_max": float(m["ttft"].max())})
            print(f"{rate:g} req/s, max_skips {skips}: useful decode {out[-1]['useful_decode']:.3f}, "
                  f"{out[-1]['throughput_tok_s']:.0f} tok/s, p99 TTFT {out[-1]['ttft_p99']:.1f} s, max {out[-1]['ttft_max']:.1f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[20, 30, 40])
    ap.add_argument("--skips", type=int, nargs="+", default=[4, 32, 1000])
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--config", default=None, help="Base config (default: the packaged default sweep).")
    ap.add_argument("--set", action="append", default=[], help="Override a config key (repeatable).")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    before = os.getloadavg()
    common = [*args.set, f"traffic.rates={list(args.rates)}", f"traffic.duration_s={args.duration}", "strategies=[dynamic]",
              f"traffic.repeats={args.repeats}", "report=false"]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for name, on in (("plain", "false"), ("grouped", "true")):
            cfg = load_user_config(args.config, common + [f"dynamic.group_by_length={on}"])
            dirs.append(run_sweep(cfg, Path(tmp) / name))
        exps = load(dirs)
        summary, requests, rates = combined(exps)
        cmp = stats.compare(summary, requests, "dynamic @ grouped", "dynamic @ plain", metrics=METRICS)
        measured = requests[~requests["warmup"].astype(bool) & (requests["status"] == "finished")]
        work = tl.useful_work(tl.batches(measured))
    per_rate = []
    for rate in rates:
        row = {"rate": rate}
        for side in ("plain", "grouped"):
            w = work[(work["strategy"] == f"dynamic @ {side}") & (work["rate"] == rate)].iloc[0]
            row[side] = {"useful_decode": float(w["useful_decode"]), "prompt_fill": float(w["prompt_fill"]),
                         "mean_batch": float(w["mean_batch"])}
        row["changes"] = {r["metric"]: {"rel": r["rel"], "rel_low": r["rel_low"], "rel_high": r["rel_high"],
                                        "supported": bool(r["supported"]), "method": r["method"],
                                        "grouped": r["a_value"], "plain": r["b_value"]}
                          for _, r in cmp[cmp["rate"] == rate].iterrows()}
        per_rate.append(row)
        print(f"{rate:g} req/s: useful decode {row['plain']['useful_decode']:.3f} -> {row['grouped']['useful_decode']:.3f}, "
              + ", ".join(f"{m} {c['rel']:+.1%}" for m, c in row["changes"].items()))
    sweep = skip_sweep(args, max(args.rates))
    record = {"command": "python " + shlex.join(sys.argv), "cpus": os.cpu_count(),
              "load_avg_1_5_15": {"before": before, "after": os.getloadavg()}, "duration_s": args.duration,
              "repeats": args.repeats, "dynamic_cap": load_user_config(args.config, common).dynamic.max_batch_size,
              "config": args.config, "backend": load_user_config(args.config, common).backend.kind,
              "rates": per_rate, "skip_sweep": sweep}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
