"""One trace, one client, several servers: batchlab serve (naive/dynamic/continuous) vs vLLM vs
transformers serve, on the same local tiny model; plus what `batchlab serve` adds over calling
the same scheduler in-process.

    python benchmarks/serving.py configs/vs-vllm.yaml [--servers batchlab,vllm,transformers] [--no-pin]

For each server, the config's rates are swept in ascending order through the OpenAI backend
(open loop, Poisson, one seeded trace per rate, identical for every server) until the server
saturates; the highest rate whose p99 TTFT and TPOT meet the config's SLO is the rate it
sustains. Servers run one at a time, pinned to core 1 while this load generator has core 0
(2 cores here; vLLM's engine busy-waits). Memory: batchlab's peak
RSS above its loaded baseline (from its /metrics) next to vLLM's KV pool (reserved up front) and
its peak use of it (sampled from its /metrics), each labelled. Every figure is from this run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchlab.backends.openai import OpenAIBackend  # noqa: E402
from batchlab.baselines import vllm as servers  # noqa: E402
from batchlab.baselines.loadtest import closed_loop, open_loop  # noqa: E402
from batchlab.core.config import RunConfig, load_config  # noqa: E402
from batchlab.report.capacity import SERVED  # noqa: E402  (the report's own threshold: one number)

PORT = 8010
SERVER_CPU, CLIENT_CPU = "1", 0   # --pin: every server on core 1, the load generator on core 0
PIN_SERVER: list[str] = []        # set by --pin to a taskset prefix


# --- servers ---------------------------------------------------------------------------------
def start_batchlab(config: str, strategy: str, overrides: list[str]) -> subprocess.Popen:
    cmd = [*PIN_SERVER, sys.executable, "-m", "batchlab.cli", "serve", config, "--strategy", strategy,
           "--port", str(PORT), "--model-name", "tiny", "--max-queue", "100000"]
    for o in overrides:
        cmd += ["--set", o]
    log = open(ROOT / ".data" / f"serve-{strategy}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"batchlab serve ({strategy}) exited: see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"batchlab serve ({strategy}) did not come up")


class MetricsSampler(threading.Thread):
    """Polls a server's /metrics while it is loaded; keeps the maximum of the named series."""

    def __init__(self, url: str, names: tuple[str, ...]):
        super().__init__(daemon=True)
        self.url, self.names, self.peak = url, names, {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            try:
                text = httpx.get(self.url, timeout=2).text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                for name in self.names:
                    if line.startswith(name) and not line.startswith("#"):
                        self.peak[name] = max(self.peak.get(name, 0.0), float(line.rsplit(" ", 1)[1]))

    def stop(self) -> dict:
        self.stop_event.set()
        self.join(3)
        return self.peak


WARMUP_USERS = 8         # a closed-loop burst before each server's sweep: first-call costs stay out of it
KEEPS_UP = SERVED        # "sustains" needs completed req/s >= this fraction of the offered rate (DESIGN.md)
SATURATED = 0.9          # below this fraction the server is past capacity: higher rates are not tried


def meets(s: dict, cfg: RunConfig) -> bool:
    """p99 TPOT and p99 TTFT within the config's SLO (TTFT matters: a server that sends a whole
    answer at once has a TPOT near zero on the client, whatever its batches cost)."""
    checks = [(cfg.slo.tpot_s, s["tpot_p99"]), (cfg.slo.ttft_s, s["ttft_p99"]), (cfg.slo.e2e_s, s["e2e_p99"])]
    return all(limit is None or value <= limit for limit, value in checks)


def keeps_up(s: dict, reqs: list, warmup_s: float) -> float:
    """Completed req/s over the rate that actually arrived (the measured requests' count over
    their arrival span): a server whose queue grows serves less than arrives, even while its
    p99 TTFT still looks fine on a short point."""
    arrivals = sorted(r.arrival_time for r in reqs if r.arrival_time >= warmup_s)
    if len(arrivals) < 2 or not s["requests_per_s"] > 0:
        return 0.0
    offered = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    return s["requests_per_s"] / offered


# --- sweeping one server -----------------------------------------------------------------------
def sweep(name: str, backend: OpenAIBackend, cfg: RunConfig, metrics_url: str, series: tuple[str, ...],
          repeats: int) -> dict:
    """`repeats` passes of ascending rates, each until the server falls behind; per-rate summaries
    and, per pass, the highest rate it sustains: no failures, p99 within the SLO, and completed
    >= 95 % of what arrived (naive batching can miss the SLO at low rates, where batches fill
    slowly, and meet it higher up, so a pass goes on past a miss until the server falls behind)."""
    passes = []
    closed_loop(backend, WARMUP_USERS, 1, cfg.traffic.prompt_len.value, cfg.traffic.output_len.value)
    sampler = MetricsSampler(metrics_url, series)
    sampler.start()
    for rep in range(repeats):
        points, sustained = [], None
        for rate in cfg.traffic.rates:
            s, reqs = open_loop(backend, cfg.traffic, rate, cfg.slo)
            ratio = keeps_up(s, reqs, cfg.traffic.warmup_s)
            ok = s["failed"] == 0 and s["unfinished"] == 0 and meets(s, cfg) and ratio >= KEEPS_UP
            behind = s["failed"] > 0 or ratio < SATURATED
            points.append({k: s[k] for k in ("rate", "num_requests", "finished", "failed", "throughput_tok_s",
                                             "requests_per_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
                                             "e2e_p50", "send_lag_p50", "send_lag_p99", "send_lag_flag", "errors")}
                          | {"served_share": ratio, "sustained": ok})
            print(f"  {name:<22} #{rep + 1} {rate:5g} req/s  {s['throughput_tok_s']:7.0f} tok/s  served {ratio:6.1%}  "
                  f"TTFT p50/p99 {s['ttft_p50'] * 1e3:7.1f}/{s['ttft_p99'] * 1e3:8.1f} ms  TPOT p50/p99 "
                  f"{s['tpot_p50'] * 1e3:6.1f}/{s['tpot_p99'] * 1e3:7.1f} ms  failed {s['failed']}  send-lag p99 "
                  f"{s['send_lag_p99'] * 1e3:6.1f} ms{'' if ok else '  <- not sustained'}"
                  f"{'  <- behind' if behind else ''}", flush=True)
            if ok:
                sustained = rate
            if behind:
                break
        passes.append({"points": points, "sustained_rate": sustained,
                       "saturated_tok_s": max(p["throughput_tok_s"] for p in points)})
    return {"server": name, "passes": passes, "memory": sampler.stop()}


def run_batchlab(args, cfg: RunConfig) -> list[dict]:
    out = []
    for strategy in cfg.strategies:
        proc = start_batchlab(args.config, strategy, args.set)
        try:
            backend = OpenAIBackend(f"http://127.0.0.1:{PORT}/v1", "tiny", timeout_s=args.timeout)
            out.append(sweep(f"batchlab serve {strategy}", backend, cfg, f"http://127.0.0.1:{PORT}/metrics",
                             ("batchlab_peak_memory_bytes", "batchlab_running_sequences"), args.sweep_repeats))
        finally:
            proc.terminate()
            proc.wait(30)
    return out


def run_external(server: str, args, cfg: RunConfig) -> dict:
    running = servers.up(server, "tiny", servers.DEFAULT_PORTS[server], Path(args.venv), 1024, "float32", 400,
                         cpus=SERVER_CPU if PIN_SERVER else None)
    try:
        text = server == "transformers"     # transformers serve takes text prompts and no ignore_eos
        backend = OpenAIBackend(running.url, running.model, timeout_s=args.timeout,
                                prompt_format="text" if text else "tokens",
                                length_control="generation_config" if text else "ignore_eos")
        series = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running") if server == "vllm" else ()
        res = sweep(server, backend, cfg, running.url.removesuffix("/v1") + "/metrics", series, args.sweep_repeats)
        if server == "vllm":
            res["kv_pool"] = servers.kv_cache_usage(running.url)
        return res
    finally:
        servers.down(server)


# --- added latency of the HTTP layer -------------------------------------------------------------
def overhead(args) -> dict:
    """Same scheduler and simulated backend (real time), same trace: in-process vs through HTTP.
    The simulator's step times are fixed, so the difference is what serving adds. Two presets:
    `toy` (0.7 ms steps: the worst case) and the default 7B-on-A100 model (~8 ms steps). The
    round trip of GET /health is measured alongside: the floor that loopback HTTP and process
    scheduling on this machine set, whatever the server does. Two figures: TTFT as the client
    sees it (httpx's own work before a request leaves included), and from the moment httpx writes
    the request to the socket (what the server and loopback add; the target's measure). The
    in-process side runs on the server's event loop (uvloop when installed)."""
    from batchlab.backends import make_backend
    from batchlab.core.clock import RealClock
    from batchlab.core.traffic import build_trace
    from batchlab.run.point import run_trace

    result = {"rate": args.overhead_rate, "repeats": args.repeats}
    for preset in ("toy", "llama2-7b-a100"):
        sets = ["backend.kind=sim", f"backend.preset={preset}", "traffic.prompt_len=32", "traffic.output_len=32",
                "traffic.duration_s=8", "traffic.warmup_s=0", "dynamic.max_wait_ms=2"]
        cfg = load_config(None, sets)
        trace = build_trace(cfg.traffic, args.overhead_rate)
        for strategy in ("dynamic", "continuous"):
            rows = {"in_process": [], "http": []}
            for _ in range(args.repeats):
                clock = RealClock()
                backend = make_backend(cfg)
                # NOTE: offline, the simulator jumps whole decode windows in one sleep (every arrival
                # is known); a server cannot know arrivals ahead, so it sleeps step by step. Same here,
                # or the in-process side would be idealised rather than the same scheduler.
                backend.multi_step = False
                reqs, _ = run_like_server(run_trace(cfg, strategy, trace, backend, clock))
                rows["in_process"].append(_lat(reqs))
                proc = start_batchlab_sim(strategy, sets)
                try:
                    backend = OpenAIBackend(f"http://127.0.0.1:{PORT}/v1", "tiny")
                    s, reqs = open_loop(backend, cfg.traffic, args.overhead_rate)
                    rows["http"].append(_lat(reqs) | _split(reqs, backend.server_timing, s["t0"]) |
                                        _on_wire(reqs, backend.sent_at, s["t0"]) |
                                        {"send_lag_p50": s["send_lag_p50"], "health_rtt_p50": health_rtt()})
                finally:
                    proc.terminate()
                    proc.wait(30)
            med = {side: {k: float(np.median([r[k] for r in v])) for k in v[0]} for side, v in rows.items()}
            key = f"{strategy}/{preset}"
            h, base = med["http"], med["in_process"]
            paired = list(zip(rows["http"], rows["in_process"]))
            result[key] = med | {"added_ttft_p50_ms": (h["ttft_p50"] - base["ttft_p50"]) * 1e3,
                                 "server_added_ttft_per_repeat_ms": [(a["ttft_on_wire_p50"] - b["ttft_p50"]) * 1e3
                                                                     for a, b in paired],
                                 "added_ttft_per_repeat_ms": [(a["ttft_p50"] - b["ttft_p50"]) * 1e3 for a, b in paired],
                                 "added_e2e_p50_ms": (h["e2e_p50"] - base["e2e_p50"]) * 1e3,
                                 "server_added_ttft_p50_ms": (h["ttft_on_wire_p50"] - base["ttft_p50"]) * 1e3}
            print(f"  overhead {key:<28} TTFT p50 in-process {med['in_process']['ttft_p50'] * 1e3:7.2f} ms, "
                  f"HTTP {h['ttft_p50'] * 1e3:7.2f} ms (+{result[key]['added_ttft_p50_ms']:.2f}); "
                  f"E2E p50 +{result[key]['added_e2e_p50_ms']:.2f} ms | per request, p50: in flight to the server "
                  f"{h['to_server_p50'] * 1e3:.2f} ms (send lag {h['send_lag_p50'] * 1e3:.2f}), first token to the client "
                  f"{h['first_to_client_p50'] * 1e3:.2f} ms, TTFT inside the server {h['server_ttft_p50'] * 1e3:.2f} ms; "
                  f"/health round trip {h['health_rtt_p50'] * 1e3:.2f} ms | httpx before the request leaves "
                  f"{h['client_pre_send_p50'] * 1e3:.2f} ms; TTFT from there {h['ttft_on_wire_p50'] * 1e3:.2f} ms "
                  f"(+{result[key]['server_added_ttft_p50_ms']:.2f}: what the server adds)", flush=True)
    return result


def loadgen(args) -> dict:
    """The load generator's own arrival-time error at 200 req/s (planned vs actual send), with no
    server competing for the CPU (httpx.MockTransport answers at once with a streamed reply of
    1 or 32 chunks) and against batchlab serve (simulator, toy preset, 8-token outputs)."""
    from batchlab.core.config import TrafficConfig

    traffic = TrafficConfig(duration_s=5, warmup_s=0, seed=1, prompt_len=16, output_len=1)
    out = {}
    for label, chunks in (("mock, 1 chunk", 1), ("mock, 32 chunks", 32), ("batchlab serve, 8 tokens", 8)):
        lags = []
        for _ in range(args.repeats):
            if label.startswith("mock"):
                backend = OpenAIBackend("http://mock/v1", "m", transport=httpx.MockTransport(_mock_reply))
                tr = traffic.model_copy(update={"output_len": traffic.output_len.model_copy(update={"value": chunks})})
                s, _ = open_loop(backend, tr, 200.0)
            else:
                proc = start_batchlab_sim("continuous", ["backend.kind=sim", "backend.preset=toy"])
                try:
                    backend = OpenAIBackend(f"http://127.0.0.1:{PORT}/v1", "tiny")
                    tr = traffic.model_copy(update={"output_len": traffic.output_len.model_copy(update={"value": chunks})})
                    s, _ = open_loop(backend, tr, 200.0)
                finally:
                    proc.terminate()
                    proc.wait(30)
            lags.append(s["send_lag_p99"])
        out[label] = {"send_lag_p99_ms_median": float(np.median(lags)) * 1e3, "runs_ms": [x * 1e3 for x in lags]}
        print(f"  load generator at 200 req/s ({label}): send lag p99 {out[label]['send_lag_p99_ms_median']:.2f} ms "
              f"(median of {args.repeats}; runs {', '.join(f'{x:.2f}' for x in out[label]['runs_ms'])})", flush=True)
    return out


def _mock_reply(request: httpx.Request) -> httpx.Response:
    n = json.loads(request.content)["max_tokens"]
    events = [{"choices": [{"index": 0, "text": " t"}]}] * n
    events.append({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}})
    return httpx.Response(200, content=b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events))


def run_like_server(main):
    """Run the in-process side on the event loop `batchlab serve` gets (uvicorn's loop="auto":
    uvloop when installed): how punctually a loop wakes the simulator's step timers differs
    between loops (over 1 ms of TTFT here), and that is no part of what serving adds."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def health_rtt(n: int = 30) -> float:
    times = []
    with httpx.Client() as c:
        for _ in range(n):
            t = time.perf_counter()
            c.get(f"http://127.0.0.1:{PORT}/health")
            times.append(time.perf_counter() - t)
    return float(np.median(times))


def start_batchlab_sim(strategy: str, sets: list[str]) -> subprocess.Popen:
    cmd = [*PIN_SERVER, sys.executable, "-m", "batchlab.cli", "serve", "--strategy", strategy, "--port", str(PORT),
           "--model-name", "tiny"]
    for o in sets:
        cmd += ["--set", o]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    for _ in range(200):
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("batchlab serve (sim) did not come up")


def _split(reqs, timing: dict, t0: float) -> dict:
    """Where an HTTP request's time goes, from batchlab serve's own stamps (same clock; the
    client's stamps were rebased to the run's start t0)."""
    rows = [(r, timing[r.request_id]) for r in reqs if r.request_id in timing and r.token_times]
    return {"to_server_p50": float(np.median([t["arrival"] - t0 - r.arrival_time for r, t in rows])),
            "first_to_client_p50": float(np.median([r.token_times[0] + t0 - t["first_token"] for r, t in rows])),
            "server_ttft_p50": float(np.median([t["first_token"] - t["arrival"] for r, t in rows]))}


def _on_wire(reqs, sent_at: dict, t0: float) -> dict:
    """The same TTFT from the moment httpx began writing the request to the socket: the in-process
    side has no client library, so the 1.5-2 ms httpx spends building and pooling a request before it
    leaves is the client's cost, not the server's. Transit both ways stays in."""
    rows = [(r, sent_at[r.request_id] - t0) for r in reqs
            if r.status.value == "finished" and r.request_id in sent_at]
    return {"client_pre_send_p50": float(np.median([sent - r.arrival_time for r, sent in rows])),
            "ttft_on_wire_p50": float(np.median([r.token_times[0] - sent for r, sent in rows]))}


def _lat(reqs) -> dict:
    ok = [r for r in reqs if r.status.value == "finished"]
    ttft = [r.token_times[0] - r.arrival_time for r in ok]
    e2e = [r.token_times[-1] - r.arrival_time for r in ok]
    return {"ttft_p50": float(np.median(ttft)), "e2e_p50": float(np.median(e2e)), "finished": len(ok)}


# --- result file -------------------------------------------------------------------------------
def save(report: dict, path: Path) -> None:
    """Rewritten after every server, so a crash late in the run keeps what was measured."""
    run = report["reruns"][-1] if report.get("reruns") else report      # the run now going on
    run["load_avg_1_5_15"]["after"] = list(os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def put(report: dict, res: dict) -> None:
    """Add a server's result, replacing an earlier one of the same name (a rerun)."""
    names = [r["server"] for r in report["servers"]]
    if res["server"] in names:
        report["servers"][names.index(res["server"])] = res
    else:
        report["servers"].append(res)


def rerun_into(path: Path, fresh: dict) -> dict:
    """--rerun: keep the result file's other servers and record this run beside its command, so
    the file says which rows came from which run (and under what load)."""
    old = json.loads(path.read_text())
    if old["trace"] != fresh["trace"] or old["slo"] != fresh["slo"]:
        raise SystemExit(f"{path} was measured with another trace or SLO; rerun everything instead")
    old.setdefault("reruns", []).append({"command": fresh["command"], "load_avg_1_5_15": fresh["load_avg_1_5_15"]})
    return old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default=str(ROOT / "configs" / "vs-vllm.yaml"))
    ap.add_argument("--servers", default="batchlab,vllm,transformers,overhead,loadgen",
                    help="any of batchlab, vllm, transformers, overhead, loadgen (comma-separated)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"))
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    ap.add_argument("--overhead-rate", type=float, default=2.0, help="low: the overhead, not queueing, is measured")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the overhead and load-generator measurements")
    ap.add_argument("--sweep-repeats", type=int, default=2, help="passes over the rates for each server")
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "serving.json"), help="result file")
    ap.add_argument("--rerun", action="store_true",
                    help="replace only the servers named in --servers in an existing result file")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin (default: servers on core 1, this load generator on core 0, because vLLM's "
                         "engine busy-waits on a core and starves a client beside it)")
    args = ap.parse_args()
    args.pin = args.pin and len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset") is not None
    if args.pin:
        PIN_SERVER[:] = ["taskset", "-c", SERVER_CPU]
        os.sched_setaffinity(0, {CLIENT_CPU})
    cfg = load_config(args.config, args.set)
    (ROOT / ".data").mkdir(exist_ok=True)
    wanted = args.servers.split(",")
    t = cfg.traffic
    report = {"command": " ".join(["python benchmarks/serving.py", *sys.argv[1:]]).replace(str(ROOT) + "/", ""),
              "cpus": os.cpu_count(), "pinned": bool(args.pin), "load_avg_1_5_15": {"before": list(os.getloadavg())},
              "trace": {"arrival": t.arrival, "rates": t.rates, "duration_s": t.duration_s, "warmup_s": t.warmup_s,
                        "prompt_len": t.prompt_len.value, "output_len": t.output_len.value},
              "slo": {k: v for k, v in cfg.slo.model_dump().items() if v}, "keeps_up": KEEPS_UP,
              "sweep_repeats": args.sweep_repeats, "servers": []}
    out = Path(args.json)
    if args.rerun:
        report = rerun_into(out, report)
    print(f"trace: {t.arrival}, rates {t.rates}, {t.duration_s:g} s each, prompt {t.prompt_len.value} / output "
          f"{t.output_len.value} tokens; {args.sweep_repeats} pass(es) per server", flush=True)
    if "batchlab" in wanted:
        for res in run_batchlab(args, cfg):
            put(report, res)
        save(report, out)
    for name in ("vllm", "transformers"):
        if name in wanted:
            try:
                put(report, run_external(name, args, cfg))
            except Exception as e:  # noqa: BLE001 - a baseline that cannot start is reported, not fatal
                print(f"  {name}: could not run: {e}", flush=True)
                put(report, {"server": name, "passes": [], "error": str(e)})
            save(report, out)
    if "overhead" in wanted:
        report["overhead"] = overhead(args)
        save(report, out)
    if "loadgen" in wanted:
        report["loadgen"] = loadgen(args)
    save(report, out)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from readme_figures import serving as render
    print(render(report))
    print(f"wrote {out}; `python benchmarks/readme_figures.py` puts it in the README")


if __name__ == "__main__":
    main()
