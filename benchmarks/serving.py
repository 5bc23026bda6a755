"""One trace, one client, several servers: batchlab serve (naive/dynamic/continuous) vs vLLM vs
transformers serve, on the same local tiny model; plus what `batchlab serve` adds over calling
the same scheduler in-process.

    python benchmarks/serving.py configs/vs-vllm.yaml [--servers batchlab,vllm] [--set strategies=[continuous]]

The rate each server sustains is found by bisection, not read off a fixed grid: from a starting
bracket (--bracket, widened by doubling where it does not hold the knee) until hi / lo - 1 is
within --tolerance (10 %). A rate holds when a seeded Poisson point of --duration seconds (30)
after the warm-up, sent through the OpenAI backend, passes `judge`: no failures, the config's p99
limits met, >= 95 % of the offered tokens served in the measured window (core/sustain.py), and no
growing queue (the report's past-capacity test). Each server is searched --sustain-repeats times
(3), restarted each time, in an order reversed every repeat (A B, B A, A B); later repeats start
from the previous repeat's bracket. Before each search a burst of --burst requests sent at once
gives the saturated throughput (core/sustain.py saturated_tokens). Servers run one at a time,
pinned to core 1 while this load generator has core 0 (2 cores here; vLLM's engine busy-waits).
Memory: batchlab's peak RSS above its loaded baseline (from its /metrics) next to vLLM's KV pool
(reserved up front) and its peak use of it, each labelled. Every figure is from this run, except
parts carried over from the result file (said so in it).
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
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchlab.backends.openai_client import OpenAIBackend  # noqa: E402
from batchlab.baselines import vllm as servers  # noqa: E402
from batchlab.baselines.loadtest import closed_loop, open_loop  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.config import RunConfig  # noqa: E402
from batchlab.core.sustain import SERVED, saturated_rate, saturated_tokens, served_share  # noqa: E402
from batchlab.core.trace_item import TraceItem  # noqa: E402
from batchlab.errors import ConfigError  # noqa: E402
from batchlab.report import stats  # noqa: E402  (the report's growing-queue test, not a copy)
from batchlab.run.config import load_config  # noqa: E402

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


WARMUP_USERS = 8         # a closed-loop burst before each server's search: first-call costs stay out of it
TOLERANCE = 0.10         # the search stops once its bracket's hi / lo - 1 is within this
MAX_POINTS = 10          # a search that has not settled by then reports the bracket it has
BURST = 1024             # requests sent at once for the saturated throughput: well above any server's batch


# --- the rule: does one point sustain its rate? ---------------------------------------------------
def meets(s: dict, cfg: RunConfig) -> list[str]:
    """The SLO percentiles this point misses: p99 TPOT, TTFT and E2E against the config's limits
    (TTFT matters: a server that sends a whole answer at once has a TPOT near zero on the client,
    whatever its batches cost)."""
    checks = [("TPOT p99", cfg.slo.tpot_s, s["tpot_p99"]), ("TTFT p99", cfg.slo.ttft_s, s["ttft_p99"]),
              ("E2E p99", cfg.slo.e2e_s, s["e2e_p99"])]
    return [name for name, limit, value in checks if limit is not None and not value <= limit]


def queue_growth(reqs: list, name: str, rate: float, warmup_s: float) -> tuple[float, bool]:
    """The report's past-capacity test (report/stats.py past_capacity: queue wait rising with
    arrival time faster than GROWTH s/s) on this point's requests; returns the slope and the verdict.
    NOTE: a client never sees when a server admits a request, so the queue wait it fits is TTFT
    (the server's queue wait plus one prefill, whose trend is the queue's)."""
    rows = [{"strategy": name, "rate": rate, "repeat": 0, "status": r.status.value,
             "warmup": int(r.arrival_time < warmup_s), "arrival_time": r.arrival_time,
             "queue_wait": r.token_times[0] - r.arrival_time if r.token_times else np.nan} for r in reqs]
    frame = pd.DataFrame(rows)
    frame = frame[(frame["status"] != "finished") | frame["queue_wait"].notna()]
    done = frame[(frame["status"] == "finished") & (frame["warmup"] == 0)]
    slope = float(np.polyfit(done["arrival_time"], done["queue_wait"], 1)[0]) if len(done) > 2 else float("nan")
    return slope, (name, float(rate)) in stats.past_capacity(pd.DataFrame([{"strategy": name, "rate": rate}]), frame)


def judge(s: dict, reqs: list, name: str, cfg: RunConfig) -> dict:
    """Whether one point sustains its rate, and why not: no request failed, the SLO percentiles
    met, the work served in the measured window >= SERVED of the work offered in it
    (core/sustain.py served_share: output tokens stamped in the window over those asked for by the
    requests that arrived in it), and no growing queue (`queue_growth`)."""
    lo = cfg.traffic.warmup_s
    hi = lo + cfg.traffic.duration_s
    served = served_share(reqs, lo, hi)
    slope, growing = queue_growth(reqs, name, s["rate"], lo)
    offered = sum(r.max_new_tokens for r in reqs if lo <= r.arrival_time < hi)
    why = ([f"{s['failed'] + s['unfinished']} failed"] if s["failed"] or s["unfinished"] else []) + meets(s, cfg)
    if not served >= SERVED:
        why.append(f"served {100 * served:.1f} %")
    if growing:
        why.append(f"queue growing {slope:.2f} s/s")
    return {"served_share": served, "window_tok_s": served * offered / (hi - lo), "ttft_slope": slope,
            "sustained": not why, "why": why}


# --- the search: bisection on the rate ------------------------------------------------------------
def knee(holds, lo: float, hi: float, tolerance: float = TOLERANCE, max_points: int = MAX_POINTS) -> dict:
    """The highest rate that `holds` (a function of the rate: run a point, apply the rule), by a
    bracket search. First the bracket: `lo` must hold and `hi` fail; where one does not, the
    bracket moves down (or up) by its own ratio, a ratio squared after every move (from 40,80:
    x2, x4, x16; from a 10 % bracket: x1.1, x1.21, x1.46, so a knee that moved is caught in a few
    points while the first move overshoots little: a point far past capacity takes long to drain).
    Then bisection until hi / lo - 1 <= tolerance. NOTE: the midpoint is geometric, because the
    width is a ratio: a 2x bracket settles in 3 bisections whichever side the knee is on
    (arithmetic midpoints need up to 4). Returns the highest rate held below the lowest that
    failed (None: none held down to a thousandth of `lo`), that failing rate (None: none failed),
    the rates probed in order, and whether the bracket got within the tolerance."""
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi (got {lo:g}, {hi:g})")
    probes: list[tuple[float, bool]] = []

    def probe(rate: float) -> bool:
        ok = bool(holds(rate))
        probes.append((rate, ok))
        return ok

    floor, step = lo / 1000, hi / lo
    good: float | None = None
    bad: float | None = None
    while good is None and lo >= floor and len(probes) < max_points:
        if probe(lo):
            good = lo
        else:
            bad, lo, step = lo, _round(lo / step), step * step
    while bad is None and good is not None and len(probes) < max_points:
        if probe(hi):
            good, hi, step = hi, _round(hi * step), step * step
        else:
            bad = hi
    while good is not None and bad is not None and bad / good - 1 > tolerance and len(probes) < max_points:
        mid = _round((good * bad) ** 0.5)
        if mid in (good, bad):           # NOTE: as fine as the rounding goes
            break
        if probe(mid):
            good = mid
        else:
            bad = mid
    return {"sustained_rate": good, "failed_rate": bad, "probes": [r for r, _ in probes],
            "settled": good is not None and bad is not None and bad / good - 1 <= tolerance}


def _round(rate: float) -> float:
    """Three significant figures: a probe's rate reads as typed, well inside a 10 % bracket."""
    return float(f"{rate:.3g}")


def alternate(names: list[str], repeat: int) -> list[str]:
    """The servers' order in repeat `repeat` (0-based): reversed every other repeat (A B, B A, A B,
    ...), so a machine that drifts over the run does not always favour the same server."""
    return list(names) if repeat % 2 == 0 else list(reversed(names))


def saturated(backend: OpenAIBackend, n: int, prompt_len: int, output_len: int) -> dict:
    """`n` requests sent at once (the same trace for every server): output tokens per second in
    the burst's steady middle (core/sustain.py saturated_tokens: the queue never empties there),
    and requests per second (saturated_rate)."""
    trace = [TraceItem(0.0, prompt_len, output_len) for _ in range(n)]
    reqs, _ = RealClock().run(backend.run_trace(trace, RealClock()))
    failed = sum(r.status.value != "finished" for r in reqs)
    return {"requests": n, "failed": failed, "tok_s": saturated_tokens(reqs), "req_s": saturated_rate(reqs)}


# --- one server, one repeat -----------------------------------------------------------------------
POINT_KEYS = ("rate", "num_requests", "finished", "failed", "throughput_tok_s", "requests_per_s", "ttft_p50",
              "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "send_lag_p50", "send_lag_p99",
              "send_lag_flag", "errors")


def search_one(name: str, backend: OpenAIBackend, cfg: RunConfig, bracket: tuple[float, float], args) -> dict:
    """Warm up, measure the saturated burst, then search the knee from `bracket` (--max-points 0:
    the burst alone, for a quick paired throughput check); every point kept."""
    burst = args.burst
    closed_loop(backend, WARMUP_USERS, 1, cfg.traffic.prompt_len.value, cfg.traffic.output_len.value)
    sat = saturated(backend, burst, cfg.traffic.prompt_len.value, cfg.traffic.output_len.value) if burst else None
    if sat:
        print(f"  {name:<26} burst of {burst}: {sat['tok_s']:7.0f} tok/s, {sat['req_s']:6.1f} req/s saturated, "
              f"failed {sat['failed']}", flush=True)
    points = []

    def holds(rate: float) -> bool:
        s, reqs = open_loop(backend, cfg.traffic, rate, cfg.slo)
        v = judge(s, reqs, name, cfg)
        points.append({k: s[k] for k in POINT_KEYS} | v)
        print(f"  {name:<26} {rate:6g} req/s  {s['throughput_tok_s']:6.0f} tok/s  served {v['served_share']:6.1%}  "
              f"TTFT p50/p99 {s['ttft_p50'] * 1e3:7.1f}/{s['ttft_p99'] * 1e3:7.1f} ms (slope {v['ttft_slope']:+.3f} s/s)  "
              f"TPOT p99 {s['tpot_p99'] * 1e3:5.1f} ms  send-lag p99 {s['send_lag_p99'] * 1e3:6.1f} ms  "
              f"{'sustained' if v['sustained'] else 'NOT: ' + ', '.join(v['why'])}", flush=True)
        return v["sustained"]

    found = (knee(holds, *bracket, tolerance=args.tolerance, max_points=args.max_points) if args.max_points else
             {"sustained_rate": None, "failed_rate": None, "probes": [], "settled": False})
    return found | {"bracket_start": list(bracket), "points": points, "saturated": sat}


@contextmanager
def serving(name: str, args, cfg: RunConfig):
    """Start one server (pinned), yield (backend, /metrics URL, series to sample), stop it."""
    if name.startswith("batchlab serve "):
        proc = start_batchlab(args.config, name.removeprefix("batchlab serve "), args.set)
        try:
            yield (OpenAIBackend(f"http://127.0.0.1:{PORT}/v1", "tiny", timeout_s=args.timeout),
                   f"http://127.0.0.1:{PORT}/metrics", ("batchlab_peak_memory_bytes", "batchlab_running_sequences"))
        finally:
            proc.terminate()
            proc.wait(30)
        return
    running = servers.up(name, "tiny", servers.DEFAULT_PORTS[name], Path(args.venv), 1024, "float32", 400,
                         cpus=SERVER_CPU if PIN_SERVER else None)
    try:
        text = name == "transformers"     # transformers serve takes text prompts and no ignore_eos
        backend = OpenAIBackend(running.url, running.model, timeout_s=args.timeout,
                                prompt_format="text" if text else "tokens",
                                length_control="generation_config" if text else "ignore_eos")
        series = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running") if name == "vllm" else ()
        yield backend, running.url.removesuffix("/v1") + "/metrics", series
    finally:
        servers.down(name)


def run_repeat(name: str, args, cfg: RunConfig, bracket: tuple[float, float]) -> dict:
    """One server's repeat: start it, search, sample its memory, stop it. A server that cannot start
    or breaks is recorded with its error (the other servers still run)."""
    load = os.getloadavg()[0]
    try:
        with serving(name, args, cfg) as (backend, metrics_url, series):
            sampler = MetricsSampler(metrics_url, series)
            sampler.start()
            try:
                res = search_one(name, backend, cfg, bracket, args)
            finally:
                memory = sampler.stop()
            if name == "vllm":
                res["kv_pool"] = servers.kv_cache_usage(backend.base_url)
    except Exception as e:  # noqa: BLE001 - a server that cannot start or breaks is reported, not fatal
        print(f"  {name}: could not run: {e}", flush=True)
        return {"error": str(e).splitlines()[0][:300] if str(e) else type(e).__name__, "load_1min_before": load}
    return res | {"memory": memory, "load_1min_before": load}


def next_bracket(res: dict, start: tuple[float, float]) -> tuple[float, float]:
    """The next repeat starts from this one's final bracket (two points when the knee has not
    moved); from the starting bracket again when this one found no bracket."""
    lo, hi = res.get("sustained_rate"), res.get("failed_rate")
    return (lo, hi) if lo is not None and hi is not None else start


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
                backend.decode_windows = False
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
    report["load_avg_1_5_15"]["after"] = list(os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


SERVERS = ("batchlab", "vllm", "transformers")
PARTS = (*SERVERS, "overhead", "loadgen")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default=str(ROOT / "configs" / "vs-vllm.yaml"))
    ap.add_argument("--servers", default="batchlab,vllm,transformers,overhead,loadgen",
                    help=f"any of {', '.join(PARTS)} (comma-separated)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"))
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    ap.add_argument("--duration", type=float, default=30.0,
                    help="seconds of traffic per point after the warm-up (>= 30 lets a growing queue show)")
    ap.add_argument("--bracket", default="40,80", metavar="LO,HI",
                    help="req/s the first repeat's search starts from (later repeats start from the previous one's)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE, help="stop when the bracket's hi / lo - 1 is within this")
    ap.add_argument("--max-points", type=int, default=MAX_POINTS, help="points per search at most (0: no search, the saturated burst only)")
    ap.add_argument("--burst", type=int, default=BURST,
                    help="requests sent at once for the saturated throughput (0: not measured)")
    ap.add_argument("--sustain-repeats", type=int, default=3, help="searches per server, in alternating order")
    ap.add_argument("--overhead-rate", type=float, default=2.0, help="low: the overhead, not queueing, is measured")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the overhead and load-generator measurements")
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "serving.json"), help="result file")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin (default: servers on core 1, this load generator on core 0, because vLLM's "
                         "engine busy-waits on a core and starves a client beside it)")
    args = ap.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad flags before anything starts (one line each; exit 2 in main)."""
    unknown = [s for s in args.servers.split(",") if s not in PARTS]
    if unknown:
        raise ConfigError(f"--servers: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    try:
        lo, hi = (float(x) for x in args.bracket.split(","))
    except ValueError:
        raise ConfigError(f"--bracket: want LO,HI in req/s, e.g. 40,80 (got {args.bracket!r})") from None
    if not 0 < lo < hi < float("inf"):
        raise ConfigError(f"--bracket: need 0 < LO < HI (got {args.bracket})")
    args.bracket = (lo, hi)
    if not 0 < args.tolerance < 1:
        raise ConfigError(f"--tolerance: must be between 0 and 1 (got {args.tolerance:g})")
    if args.max_points == 1:
        raise ConfigError("--max-points: 0 (burst only) or at least 2 (a bracket needs two ends)")
    if args.max_points == 0 and args.burst == 0:
        raise ConfigError("--max-points 0 with --burst 0 measures nothing")
    for flag, value, least in (("--max-points", args.max_points, 0), ("--sustain-repeats", args.sustain_repeats, 1),
                               ("--repeats", args.repeats, 1), ("--burst", args.burst, 0)):
        if value < least:
            raise ConfigError(f"{flag}: must be at least {least} (got {value})")
    if not 0 < args.timeout < float("inf"):
        raise ConfigError(f"--timeout: must be a positive number of seconds (got {args.timeout:g})")


def carry_over(path: Path, report: dict, wanted: list[str]) -> None:
    """Parts not measured this time (overhead, loadgen) stay from the result file they were
    measured for, with that run's command and load, so the file says where each came from."""
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    for part in ("overhead", "loadgen"):
        if part not in wanted and part in old:
            report[part] = old[part]
            report.setdefault("carried", {})[part] = old.get("carried", {}).get(part) or {
                "command": old["command"], "load_avg_1_5_15": old["load_avg_1_5_15"]}


def search_all(args, cfg: RunConfig, names: list[str], report: dict, out: Path) -> None:
    """Every server's searches, repeat by repeat, in alternating order; saved after each server."""
    entries = {n: {"server": n, "repeats": []} for n in names}
    report["servers"] = list(entries.values())
    brackets = dict.fromkeys(names, args.bracket)
    for rep in range(args.sustain_repeats):
        order = alternate(names, rep)
        report["order"].append(order)
        print(f"repeat {rep + 1}/{args.sustain_repeats}: {' then '.join(order)}", flush=True)
        for name in order:
            res = run_repeat(name, args, cfg, brackets[name])
            entries[name]["repeats"].append(res | {"repeat": rep, "position": order.index(name)})
            brackets[name] = next_bracket(res, args.bracket)
            save(report, out)


def main(argv: list[str] | None = None) -> None:
    try:
        args = parse_args(argv)
        cfg = load_config(args.config, [*args.set, f"traffic.duration_s={args.duration:g}"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    args.pin = args.pin and len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset") is not None
    if args.pin:
        PIN_SERVER[:] = ["taskset", "-c", SERVER_CPU]
        os.sched_setaffinity(0, {CLIENT_CPU})
    (ROOT / ".data").mkdir(exist_ok=True)
    wanted = args.servers.split(",")
    names = ([f"batchlab serve {s}" for s in cfg.strategies] if "batchlab" in wanted else []) + \
        [n for n in SERVERS[1:] if n in wanted]
    t = cfg.traffic
    report = {"command": " ".join(["python benchmarks/serving.py", *(argv if argv is not None else sys.argv[1:])])
              .replace(str(ROOT) + "/", ""),
              "cpus": os.cpu_count(), "pinned": bool(args.pin), "load_avg_1_5_15": {"before": list(os.getloadavg())},
              "trace": {"arrival": t.arrival, "duration_s": t.duration_s, "warmup_s": t.warmup_s,
                        "prompt_len": t.prompt_len.value, "output_len": t.output_len.value},
              "slo": {k: v for k, v in cfg.slo.model_dump().items() if v},
              "rule": {"served": SERVED, "growth_s_per_s": stats.GROWTH, "tolerance": args.tolerance,
                       "bracket_start": list(args.bracket), "max_points": args.max_points, "burst": args.burst},
              "sustain_repeats": args.sustain_repeats, "order": [], "servers": []}
    out = Path(args.json)
    carry_over(out, report, wanted)
    print(f"trace: {t.arrival}, {t.duration_s:g} s per point after {t.warmup_s:g} s warm-up, prompt "
          f"{t.prompt_len.value} / output {t.output_len.value} tokens; {args.sustain_repeats} searches per server "
          f"from {args.bracket[0]:g}-{args.bracket[1]:g} req/s to within {100 * args.tolerance:g} %", flush=True)
    if names:
        search_all(args, cfg, names, report, out)
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
