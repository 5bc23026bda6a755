"""The load generator at its limit: client CPU per request and the highest rate it paces on time,
batchlab's client against `vllm bench serve`'s, on a stub server that is never the limit.

    python benchmarks/loadgen.py [--lengths 32 256] [--repeats 3] [--venv .venv-vllm] [--json docs/results/loadgen.json]

The stub (batchlab/baselines/stub_server.py) streams one SSE event per token every --itl-ms and
computes nothing; it runs on core 1, every client on core 0 (a client's child processes inherit
core 0). Each client replays the same seeded Poisson trace at its exact offsets (vLLM's through
its `timed_trace` dataset; 32-token prompts, answers of the stream length):

- CPU: at a rate every client holds (--cpu-rate, per stream length), --repeats runs per client in
  rotating order; client CPU is the client process's own (batchlab: process time around the
  send loop; vLLM: process time inside its `benchmark` coroutine, imports and tokenizer loading
  excluded), per request and per streamed chunk; medians over repeats, and batchlab's median
  over vLLM's (`cpu_per_request_ratio_vs_vllm`). batchlab through httpx is run too, as before/after.
- Highest rate: a ladder of rates (--seconds each); a rate is held when every request finished,
  none failed and the send lag p99 (actual minus planned start of each request) is at most 1 ms;
  the highest rate held with p99 at most 5 ms is recorded too. A client's ladder stops at its first
  rate that fails the looser rule. batchlab with 1 and with --workers processes.
  The stub's share of its core is recorded per run; above 0.9 the rate says more about the stub.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from batchlab.backends import process
from batchlab.backends.openai_client import OpenAIBackend
from batchlab.baselines import vllm_bench
from batchlab.core.clock import RealClock
from batchlab.core.files import write_atomic
from batchlab.core.request import Status
from batchlab.errors import ConfigError, user_errors

ROOT = Path(__file__).resolve().parents[1]
PORT = 8107
LAG_RULE_S = 0.001           # the rule a rate is held under
LOOSE_RULE_S = 0.005         # and a looser one (a run's send lag is flagged above it): the ladder climbs until it fails
CPU_RATE = {32: 100.0, 256: 25.0}
LADDER = {32: [25, 50, 100, 200, 400, 700, 1000, 1400, 2000, 2800], 256: [10, 25, 50, 100, 150, 200, 300, 400]}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 256], help="streamed tokens per answer")
    ap.add_argument("--repeats", type=int, default=3, help="CPU runs per client and length")
    ap.add_argument("--cpu-seconds", type=float, default=20.0, help="seconds of arrivals per CPU run")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of arrivals per ladder rung")
    ap.add_argument("--workers", type=int, default=2, help="processes of batchlab's split client on the ladder")
    ap.add_argument("--itl-ms", type=float, default=5.0, help="the stub's milliseconds between tokens")
    ap.add_argument("--parts", default="cpu,ladder", help="cpu, ladder, or both")
    ap.add_argument("--clients", default="lean,httpx,vllm", help="clients in the CPU part")
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"), help="vLLM's environment (`batchlab vllm install`)")
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "loadgen.json"))
    return ap.parse_args()


def batchlab_run(url: str, trace, client: str, workers: int = 1) -> dict:
    """One replay by batchlab's client: CPU (this process, plus its workers'), outcome, send lag."""
    backend = OpenAIBackend(url, "tiny", timeout_s=120.0, client=client)
    clock = RealClock()
    cpu = time.process_time()
    requests, _ = clock.run(backend.run_trace(trace, clock, workers=workers))
    cpu = time.process_time() - cpu + backend.split_facts.get("loadgen_cpu_s", 0.0)
    lags = np.array(backend.send_lags)
    ok = [r for r in requests if r.status is Status.FINISHED]
    return {"cpu_s": cpu, "requests": len(requests), "finished": len(ok), "failed": len(requests) - len(ok),
            "first_error": next((r.error for r in requests if r.error), None),
            "send_lag_p50": float(np.median(lags)), "send_lag_p99": float(np.percentile(lags, 99)),
            "chunks": sum(len(backend.chunk_times.get(r.request_id, ())) for r in ok),
            **({"clock_offset_max_s": backend.split_facts["loadgen_clock_offset_max_s"]} if workers > 1 else {})}


def vllm_run(bench: vllm_bench.Bench, trace, name: str) -> dict:
    f = vllm_bench.VllmClient(bench, trace, name).finish()
    return {"cpu_s": f["client_cpu_s"], "requests": len(trace), "finished": f["completed"], "failed": f["failed"],
            "first_error": None, "send_lag_p50": f.get("send_lag_p50"), "send_lag_p99": f.get("send_lag_p99"),
            "chunks": None}


def one(kind: str, url: str, bench, trace, name: str, workers: int, stub_pid: int, itl_s: float) -> dict:
    time.sleep(1.0)                                        # the stub's streams from the last run end
    stub_cpu = vllm_bench.cpu_seconds(stub_pid)
    row = vllm_run(bench, trace, name) if kind == "vllm" else batchlab_run(url, trace, kind, workers)
    # the stub works while streams run: from the first arrival to the last one's last token
    span = trace[-1].arrival + trace[-1].output_len * itl_s
    row["stub_core_share"] = (vllm_bench.cpu_seconds(stub_pid) - stub_cpu) / span
    n = row["requests"]
    row["cpu_per_request_ms"] = row["cpu_s"] / n * 1e3 if row["cpu_s"] is not None else None
    row["cpu_per_chunk_us"] = (row["cpu_s"] / (n * trace[0].output_len) * 1e6 if row["cpu_s"] is not None else None)
    done = row["failed"] == 0 and row["finished"] == n and row["send_lag_p99"] is not None
    row["held"] = done and row["send_lag_p99"] <= LAG_RULE_S
    row["held_loose"] = done and row["send_lag_p99"] <= LOOSE_RULE_S
    return row


def parse_cost_us(n: int = 100_000) -> float:
    """Microseconds per streamed event for the lean client's own work, without the event loop or
    the kernel: the connection's read callback fed one stub event at a time (httptools' chunked
    decoding, the SSE split, and openai_client.Events: orjson and the stamp)."""
    import asyncio

    from batchlab.backends import sse_http
    from batchlab.backends.openai_client import Events
    from batchlab.baselines.stub_server import HEAD, Stream

    class Sink:
        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            pass

    async def main() -> float:
        pool = sse_http.Pool("http://127.0.0.1:1/v1", {}, 10.0)
        pool.loop = asyncio.get_running_loop()
        conn = sse_http.Connection(pool)
        conn.transport = Sink()
        conn.answer = sse_http.Answer(Events(time.perf_counter).feed)
        conn.data_received(HEAD)
        stream = Stream(Sink(), "tiny", 32, n + 1, True)
        events = [stream.next_event() for _ in range(n)]
        t = time.perf_counter()
        for e in events:
            conn.data_received(e)
        return (time.perf_counter() - t) / n * 1e6
    return min(asyncio.run(main()) for _ in range(3))


def label(kind: str, workers: int) -> str:
    return kind if workers == 1 else f"{kind} x{workers}"


def show(length: int, rate: float, name: str, row: dict) -> None:
    cpu = "?" if row["cpu_per_request_ms"] is None else f"{row['cpu_per_request_ms']:.2f} ms/req"
    lag = "?" if row["send_lag_p99"] is None else f"{row['send_lag_p99'] * 1e3:.2f} ms"
    print(f"  {length:>4} tok {rate:>6g} req/s {name:<10} {cpu:>13}  lag p99 {lag:>9}  "
          f"{row['finished']}/{row['requests']} done  stub {row['stub_core_share']:.2f} core  "
          f"{'held' if row['held'] else 'NOT held'}", flush=True)


@user_errors
def main() -> None:
    args = parse_args()
    parts = set(args.parts.split(","))
    clients = args.clients.split(",")
    if "vllm" in clients and not (Path(args.venv) / "bin" / "python").is_file():
        raise ConfigError(f"no vLLM environment at {args.venv} (`batchlab vllm install` builds one; or pass --venv)")
    if not set(args.lengths) <= set(CPU_RATE):
        raise ConfigError(f"--lengths: one of {sorted(CPU_RATE)}")
    from batchlab.backends.tiny import resolve_model
    cpus = process.split_cores(True)
    report = {"command": " ".join(["python benchmarks/loadgen.py", *sys.argv[1:]]), "cpus": os.cpu_count(),
              "pinned": bool(cpus), "load_avg_1_5_15_before": list(os.getloadavg()), "itl_ms": args.itl_ms,
              "lag_rule_s": LAG_RULE_S, "loose_rule_s": LOOSE_RULE_S, "prompt_len": 32, "lengths": {}}
    url = f"http://127.0.0.1:{PORT}/v1"
    cmd = [sys.executable, "-m", "batchlab.baselines.stub_server", "--port", str(PORT), "--itl-ms", str(args.itl_ms),
           "--model", "tiny"]
    with process.managed("loadgen-stub", cmd, url, "tiny", cpus=cpus) as stub, \
            tempfile.TemporaryDirectory(prefix="loadgen-") as work:
        bench = vllm_bench.Bench(url, stub.pid, Path(args.venv), resolve_model("tiny"), 120.0, Path(work))
        batchlab_run(url, vllm_bench.make_trace(50, 2, 32, 8, 99), "lean")          # warm: connections, imports
        for length in args.lengths:
            out = report["lengths"][str(length)] = {}
            if "cpu" in parts:
                cpu_part(args, clients, length, url, bench, stub.pid, out)
                save(report, Path(args.json))
            if "ladder" in parts:
                ladder_part(args, clients, length, url, bench, stub.pid, out, report)
    report["load_avg_1_5_15_after"] = list(os.getloadavg())
    print(f"wrote {save(report, Path(args.json))}")


def cpu_part(args, clients: list[str], length: int, url: str, bench, stub_pid: int, out: dict) -> None:
    """Every client on one trace, --repeats times in rotating order; medians and the ratios."""
    rate = CPU_RATE[length]
    trace = vllm_bench.make_trace(rate, args.cpu_seconds, 32, length, 0)
    out["lean_parse_us_per_event"] = parse_cost_us()
    runs: dict[str, list] = {c: [] for c in clients}
    for rep in range(args.repeats):
        for c in clients[rep % len(clients):] + clients[:rep % len(clients)]:
            row = one(c, url, bench, trace, f"cpu-{length}-{c}-{rep}", 1, stub_pid, args.itl_ms / 1e3)
            show(length, rate, c, row)
            runs[c].append(row)
    keys = ("cpu_per_request_ms", "cpu_per_chunk_us", "send_lag_p99")
    med = {c: {k: float(np.median([r[k] for r in rows])) for k in keys}
           for c, rows in runs.items() if all(r["cpu_s"] is not None for r in rows)}
    out["cpu"] = {"rate": rate, "seconds": args.cpu_seconds, "requests": len(trace), "runs": runs, "median": med}
    for client, key in (("lean", "cpu_per_request_ratio_vs_vllm"), ("httpx", "httpx_cpu_per_request_ratio_vs_vllm")):
        if "vllm" in med and client in med:
            out[key] = med[client]["cpu_per_request_ms"] / med["vllm"]["cpu_per_request_ms"]


def ladder_part(args, clients: list[str], length: int, url: str, bench, stub_pid: int, out: dict,
                report: dict) -> None:
    """Each client up the ladder of rates until a rung is not held."""
    ladder = out["ladder"] = {}
    for kind, workers in [("lean", 1), ("lean", args.workers), ("vllm", 1)]:
        if kind == "vllm" and "vllm" not in clients:
            continue
        name, rows = label(kind, workers), []
        for rate in LADDER[length]:
            trace = vllm_bench.make_trace(rate, args.seconds, 32, length, 1)
            row = one(kind, url, bench, trace, f"ladder-{length}-{name}-{rate}".replace(" ", ""), workers,
                      stub_pid, args.itl_ms / 1e3) | {"rate": rate}
            show(length, rate, name, row)
            rows.append(row)
            if not row["held_loose"]:
                break
        held = [r["rate"] for r in rows if r["held"]]
        loose = [r["rate"] for r in rows if r["held_loose"]]
        ladder[name] = {"held": max(held) if held else None, "held_loose": max(loose) if loose else None, "rows": rows}
        save(report, Path(args.json))


def save(report: dict, path: Path) -> Path:
    write_atomic(path, json.dumps(report, indent=1, default=float) + "\n")
    return path


if __name__ == "__main__":
    main()
