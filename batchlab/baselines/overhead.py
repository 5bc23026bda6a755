"""What serving adds, and how punctual the load generator is, each against a reference without it.

Overhead: the same scheduler and simulated backend (in real time), the same trace, in-process and
through `batchlab serve` over HTTP; the simulator's step times are fixed, so the difference is what
serving adds (the `toy` preset's 0.7 ms steps are the worst case, the default 7B's ~8 ms the usual).
Beside it, GET /health's round trip: the floor that loopback HTTP and process scheduling set.
Load generator: planned vs actual send at 200 req/s against a stub that answers at once (no server
competing for the CPU) and against batchlab serve on the simulator.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
import httpx
import numpy as np

from batchlab.backends import process
from batchlab.backends.openai_client import OpenAIBackend
from batchlab.baselines.compare import PORT, Settings
from batchlab.baselines.loadtest import open_loop
from batchlab.core.clock import RealClock
from batchlab.core.config import TrafficConfig
from batchlab.run.config import load_config

URL = f"http://127.0.0.1:{PORT}/v1"
PRESETS = ("toy", "llama2-7b-a100")
STRATEGIES = ("dynamic", "continuous")
LOADGEN_RATE = 200.0


@contextmanager
def sim_server(strategy: str, sets: list[str], cpus: str | None) -> Iterator[OpenAIBackend]:
    """batchlab serve on the simulator (no config file: the embedded default and `sets`)."""
    cmd = process.serve_command(PORT, strategy, None, sets)
    with process.managed("batchlab-serve-sim", cmd, URL, "tiny", cpus=cpus, wait_s=60):
        yield OpenAIBackend(URL, "tiny")


def stub_reply(request: httpx.Request) -> httpx.Response:
    """A stub OpenAI server for httpx.MockTransport: at once, `max_tokens` streamed chunks and usage."""
    n = json.loads(request.content)["max_tokens"]
    events = [{"choices": [{"index": 0, "text": " t"}]}] * n
    events.append({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}})
    return httpx.Response(200, content=b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events))


# --- the HTTP layer's overhead --------------------------------------------------------------------
def overhead(s: Settings) -> dict:
    """Per preset and strategy: medians over `s.repeats` of both sides, and what HTTP added."""
    result = {"rate": s.overhead_rate, "repeats": s.repeats}
    for preset in PRESETS:
        sets = ["backend.kind=sim", f"backend.preset={preset}", "traffic.prompt_len=32", "traffic.output_len=32",
                "traffic.duration_s=8", "traffic.warmup_s=0", "dynamic.max_wait_ms=2"]
        for strategy in STRATEGIES:
            rows = {"in_process": [], "http": []}
            for _ in range(s.repeats):
                rows["in_process"].append(in_process(sets, strategy, s.overhead_rate))
                rows["http"].append(over_http(sets, strategy, s))
            key = f"{strategy}/{preset}"
            result[key] = added(rows)
            say(key, result[key])
    return result


def in_process(sets: list[str], strategy: str, rate: float) -> dict:
    """The scheduler and simulator called directly, in real time, on the server's event loop."""
    from batchlab.backends import make_backend
    from batchlab.core.traffic import build_trace
    from batchlab.run.point import run_trace

    cfg = load_config(None, sets)
    backend = make_backend(cfg)
    # NOTE: offline, the simulator jumps whole decode windows in one sleep (every arrival is known);
    # a server cannot know arrivals ahead, so it sleeps step by step. Same here, or the in-process
    # side would be idealised rather than the same scheduler.
    backend.decode_windows = False
    reqs, _ = run_like_server(run_trace(cfg, strategy, build_trace(cfg.traffic, rate), backend, RealClock()))
    return latency(reqs)


def over_http(sets: list[str], strategy: str, s: Settings) -> dict:
    """The same trace through batchlab serve, with where each request's time went."""
    cfg = load_config(None, sets)
    with sim_server(strategy, sets, s.cpus) as backend:
        out, reqs = open_loop(backend, cfg.traffic, s.overhead_rate)
        return (latency(reqs) | split(reqs, backend.server_timing, out["t0"]) | on_wire(reqs, backend.sent_at, out["t0"])
                | {"send_lag_p50": out["send_lag_p50"], "health_rtt_p50": health_rtt()})


def added(rows: dict[str, list[dict]]) -> dict:
    """Medians of each side, and HTTP's addition to p50 TTFT and E2E (ms), per repeat and median."""
    med = {side: {k: float(np.median([r[k] for r in v])) for k in v[0]} for side, v in rows.items()}
    h, base = med["http"], med["in_process"]
    paired = list(zip(rows["http"], rows["in_process"]))
    return med | {"added_ttft_p50_ms": (h["ttft_p50"] - base["ttft_p50"]) * 1e3,
                  "server_added_ttft_per_repeat_ms": [(a["ttft_on_wire_p50"] - b["ttft_p50"]) * 1e3 for a, b in paired],
                  "added_ttft_per_repeat_ms": [(a["ttft_p50"] - b["ttft_p50"]) * 1e3 for a, b in paired],
                  "added_e2e_p50_ms": (h["e2e_p50"] - base["e2e_p50"]) * 1e3,
                  "server_added_ttft_p50_ms": (h["ttft_on_wire_p50"] - base["ttft_p50"]) * 1e3}


def say(key: str, r: dict) -> None:
    h, base = r["http"], r["in_process"]
    click.echo(f"  overhead {key:<28} TTFT p50 in-process {base['ttft_p50'] * 1e3:7.2f} ms, HTTP {h['ttft_p50'] * 1e3:7.2f} ms "
               f"(+{r['added_ttft_p50_ms']:.2f}); E2E p50 +{r['added_e2e_p50_ms']:.2f} ms | per request, p50: in flight to the "
               f"server {h['to_server_p50'] * 1e3:.2f} ms (send lag {h['send_lag_p50'] * 1e3:.2f}), first token to the client "
               f"{h['first_to_client_p50'] * 1e3:.2f} ms, TTFT inside the server {h['server_ttft_p50'] * 1e3:.2f} ms; "
               f"/health round trip {h['health_rtt_p50'] * 1e3:.2f} ms | httpx before the request leaves "
               f"{h['client_pre_send_p50'] * 1e3:.2f} ms; TTFT from there {h['ttft_on_wire_p50'] * 1e3:.2f} ms "
               f"(+{r['server_added_ttft_p50_ms']:.2f}: what the server adds)")


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
            c.get(URL.removesuffix("/v1") + "/health")
            times.append(time.perf_counter() - t)
    return float(np.median(times))


def split(reqs, timing: dict, t0: float) -> dict:
    """Where an HTTP request's time goes, from batchlab serve's own stamps (same clock; the
    client's stamps were rebased to the run's start t0)."""
    rows = [(r, timing[r.request_id]) for r in reqs if r.request_id in timing and r.token_times]
    return {"to_server_p50": float(np.median([t["arrival"] - t0 - r.arrival_time for r, t in rows])),
            "first_to_client_p50": float(np.median([r.token_times[0] + t0 - t["first_token"] for r, t in rows])),
            "server_ttft_p50": float(np.median([t["first_token"] - t["arrival"] for r, t in rows]))}


def on_wire(reqs, sent_at: dict, t0: float) -> dict:
    """The same TTFT from the moment httpx began writing the request to the socket: the in-process
    side has no client library, so the 1.5-2 ms httpx spends building and pooling a request before it
    leaves is the client's cost, not the server's. Transit both ways stays in."""
    rows = [(r, sent_at[r.request_id] - t0) for r in reqs if r.status.value == "finished" and r.request_id in sent_at]
    return {"client_pre_send_p50": float(np.median([sent - r.arrival_time for r, sent in rows])),
            "ttft_on_wire_p50": float(np.median([r.token_times[0] - sent for r, sent in rows]))}


def latency(reqs) -> dict:
    ok = [r for r in reqs if r.status.value == "finished"]
    return {"ttft_p50": float(np.median([r.token_times[0] - r.arrival_time for r in ok])),
            "e2e_p50": float(np.median([r.token_times[-1] - r.arrival_time for r in ok])), "finished": len(ok)}


# --- the load generator's own error ---------------------------------------------------------------
def loadgen(s: Settings) -> dict:
    """The load generator's arrival-time error at LOADGEN_RATE (planned vs actual send): against
    the stub with streamed replies of 1 or 32 chunks, and against batchlab serve (simulator, toy
    preset, 8-token outputs)."""
    traffic = TrafficConfig(duration_s=5, warmup_s=0, seed=1, prompt_len=16, output_len=1)
    out = {}
    for label, chunks in (("mock, 1 chunk", 1), ("mock, 32 chunks", 32), ("batchlab serve, 8 tokens", 8)):
        tr = traffic.model_copy(update={"output_len": traffic.output_len.model_copy(update={"value": chunks})})
        lags = [send_lag(label, tr, s) for _ in range(s.repeats)]
        out[label] = {"send_lag_p99_ms_median": float(np.median(lags)) * 1e3, "runs_ms": [x * 1e3 for x in lags]}
        click.echo(f"  load generator at {LOADGEN_RATE:g} req/s ({label}): send lag p99 "
                   f"{out[label]['send_lag_p99_ms_median']:.2f} ms (median of {s.repeats}; runs "
                   f"{', '.join(f'{x:.2f}' for x in out[label]['runs_ms'])})")
    return out


def send_lag(label: str, traffic: TrafficConfig, s: Settings) -> float:
    if label.startswith("mock"):
        backend = OpenAIBackend("http://mock/v1", "m", transport=httpx.MockTransport(stub_reply))
        return open_loop(backend, traffic, LOADGEN_RATE)[0]["send_lag_p99"]
    with sim_server("continuous", ["backend.kind=sim", "backend.preset=toy"], s.cpus) as backend:
        return open_loop(backend, traffic, LOADGEN_RATE)[0]["send_lag_p99"]
