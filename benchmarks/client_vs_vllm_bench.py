"""Our client checked against one we did not write: batchlab's OpenAI backend vs `vllm bench serve`,
one trace, one server.

    python benchmarks/client_vs_vllm_bench.py [--rate 16] [--duration 30] [--repeats 4] [--mode both] [--no-pin]

One `batchlab serve` (tiny model, continuous; pinned to core 1, the clients on core 0, as in
benchmarks/serving.py) and one seeded Poisson trace (32/32 tokens), replayed by both clients at its
exact arrival offsets: sequentially (each alone on the whole trace, AB then BA) and concurrently
(both at once, each on every other request). Per repeat: p50 TTFT, TPOT, E2E and ITL of each, the
ratio batchlab/vLLM, each client's mean over the server's own (/metrics), send lag, client CPU and
CPU used by neither. How: batchlab/baselines/vllm_bench.py.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from batchlab.backends import process
from batchlab.backends.openai_client import OpenAIBackend
from batchlab.baselines import vllm_bench
from batchlab.baselines.compare import PORT, WARMUP_USERS
from batchlab.baselines.loadtest import closed_loop
from batchlab.errors import ConfigError, user_errors

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "vs-vllm.yaml"), help="the server's config")
    ap.add_argument("--rate", type=float, default=16.0, help="req/s")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="per mode; order (or halves) alternating")
    ap.add_argument("--mode", choices=("sequential", "concurrent", "both"), default="both",
                    help="sequential: each client alone on the whole trace, AB/BA; concurrent: both at once, "
                         "each on every other request")
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"), help="the environment `batchlab vllm up` builds")
    ap.add_argument("--tokenizer", default=None, help="vLLM's tokenizer (default: the local tiny model)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "client_vs_vllm_bench.json"))
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin server (core 1) and clients (core 0)")
    return ap.parse_args()


@user_errors
def main() -> None:
    args = parse_args()
    try:
        trace = vllm_bench.make_trace(args.rate, args.duration, args.prompt_len, args.output_len, args.seed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    if not (Path(args.venv) / "bin" / "python").is_file():
        raise ConfigError(f"no vLLM environment at {args.venv} (`batchlab vllm up` builds one; or pass --venv)")
    from batchlab.backends.tiny import resolve_model
    cpus = process.split_cores(args.pin)               # vLLM's client, our child, inherits core 0
    modes = ["sequential", "concurrent"] if args.mode == "both" else [args.mode]
    report = {"command": " ".join(["python benchmarks/client_vs_vllm_bench.py", *sys.argv[1:]]),
              "pinned": bool(cpus), "load_avg_1_5_15_before": list(os.getloadavg()),
              "trace": {"rate": args.rate, "duration_s": args.duration, "requests": len(trace),
                        "prompt_len": args.prompt_len, "output_len": args.output_len, "seed": args.seed}}
    print(f"trace: {len(trace)} requests, Poisson {args.rate:g} req/s, {args.prompt_len}/{args.output_len} tokens; "
          f"{args.repeats} repeats of {' and '.join(modes)} on one server (pinned: {bool(cpus)})", flush=True)
    url = f"http://127.0.0.1:{PORT}/v1"
    cmd = process.serve_command(PORT, "continuous", args.config, [], "tiny", "--max-queue", "100000")
    with process.managed("batchlab-serve-continuous", cmd, url, "tiny", cpus=cpus) as server, \
            tempfile.TemporaryDirectory(prefix="client-vs-vllm-") as work:
        closed_loop(OpenAIBackend(url, "tiny"), WARMUP_USERS, 1, args.prompt_len, args.output_len)
        bench = vllm_bench.Bench(url, server.pid, Path(args.venv), args.tokenizer or resolve_model("tiny"), args.timeout,
                                 Path(work))
        vllm_bench.run(bench, trace, modes, args.repeats, report, Path(args.json))
    report["load_avg_1_5_15_after"] = list(os.getloadavg())
    out = vllm_bench.save(report, Path(args.json))
    for mode in modes:
        med = report[mode]["median_ratio"]
        print(f"{mode}: median ratio batchlab/vLLM: " + ", ".join(f"{m} {med[m]:.3f}" for m in vllm_bench.METRICS))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
