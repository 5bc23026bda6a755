"""One trace, one client, several servers: the highest rate each sustains, searched, not read off a grid.

Each server (batchlab serve per strategy, vLLM, transformers serve) runs alone, restarted for every
repeat, in an order reversed every repeat (A B, B A, ...) so a drifting machine favours no one.
A repeat warms the server up, sends a burst for its saturated throughput, then searches its knee
(core/search.py, geometric bisection from a starting bracket, later repeats from the previous
repeat's) with seeded Poisson points sent through the OpenAI backend and judged by core/sustain.py
`judge`; its /metrics are polled for memory meanwhile. The result is a JSON report, saved after
every server so a crash late in the run keeps what was measured.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click

from batchlab.backends import process
from batchlab.backends.metrics_page import Peaks, engine_steps, metrics_url, steps_between
from batchlab.backends.openai_client import OpenAIBackend
from batchlab.baselines import vllm
from batchlab.baselines.loadtest import closed_loop, open_loop
from batchlab.core.clock import RealClock
from batchlab.core.config import RunConfig
from batchlab.core.files import write_atomic
from batchlab.core.request import Request
from batchlab.core.search import knee, significant
from batchlab.core.sustain import GROWTH, SERVED, burst_figures, judge
from batchlab.core.trace_item import TraceItem
from batchlab.core.traffic import fixed_burst
from batchlab.errors import ConfigError

PORT = 8010                 # batchlab serve's port here
WARMUP_USERS = 8            # a closed-loop burst before each server's search: first-call costs stay out of it
TOLERANCE = 0.10            # the search stops once its bracket's hi / lo - 1 is within this
MAX_POINTS = 10             # a search that has not settled by then reports the bracket it has
BURST = 1024                # requests sent at once for the saturated throughput: well above any server's batch
OVERLOAD = 1.5              # past the knee: one point at this multiple of the sustained rate, for how a server degrades
UNBOUNDED_QUEUE = 100_000   # batchlab serve's queue bound by default here: no point reaches it, as vLLM has none
SERVERS = ("batchlab", "vllm", "transformers")
PARTS = (*SERVERS, "overhead", "loadgen")
POINT_KEYS = ("rate", "num_requests", "finished", "failed", "throughput_tok_s", "requests_per_s", "ttft_p50",
              "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "send_lag_p50", "send_lag_p99",
              "send_lag_flag", "errors")
SERIES = {"batchlab": ("batchlab_peak_memory_bytes", "batchlab_running_sequences"),
          "vllm": ("vllm:kv_cache_usage_perc", "vllm:num_requests_running")}


@dataclass
class Settings:
    """How the comparison runs (the script's flags, checked by `check`)."""
    config: str                              # batchlab serve's config (the trace's too)
    overrides: list[str]
    venv: Path                               # vLLM's environment
    timeout: float = 120.0                   # per request, s
    bracket: tuple[float, float] = (40.0, 80.0)
    tolerance: float = TOLERANCE
    max_points: int = MAX_POINTS             # 0: no search, the saturated burst only
    burst: int = BURST                       # 0: no burst
    sustain_repeats: int = 3
    overhead_rate: float = 2.0
    repeats: int = 3                         # of the overhead and load-generator measurements
    cpus: str | None = None                  # the servers' cores (process.split_cores; None: unpinned)
    overload: float = OVERLOAD               # after a search, a point at this multiple of its sustained rate (0: none)
    max_queue: int = UNBOUNDED_QUEUE         # batchlab serve's --max-queue: requests waiting before new ones get 429


def check(s: Settings, parts: list[str]) -> None:
    """Refuse what cannot run, before anything starts (one line each)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ConfigError(f"--servers: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    if not 0 < s.bracket[0] < s.bracket[1] < float("inf"):
        raise ConfigError(f"--bracket: need 0 < LO < HI (got {s.bracket[0]:g},{s.bracket[1]:g})")
    if not 0 < s.tolerance < 1:
        raise ConfigError(f"--tolerance: must be between 0 and 1 (got {s.tolerance:g})")
    if s.max_points == 1:
        raise ConfigError("--max-points: 0 (burst only) or at least 2 (a bracket needs two ends)")
    if s.max_points == 0 and s.burst == 0:
        raise ConfigError("--max-points 0 with --burst 0 measures nothing")
    for flag, value, least in (("--max-points", s.max_points, 0), ("--sustain-repeats", s.sustain_repeats, 1),
                               ("--repeats", s.repeats, 1), ("--burst", s.burst, 0), ("--max-queue", s.max_queue, 1)):
        if value < least:
            raise ConfigError(f"{flag}: must be at least {least} (got {value})")
    if not (s.overload == 0 or 1 < s.overload < float("inf")):
        raise ConfigError(f"--overload: 0 (no point past the knee) or a multiple of the knee above 1 (got {s.overload:g})")
    if not 0 < s.timeout < float("inf"):
        raise ConfigError(f"--timeout: must be a positive number of seconds (got {s.timeout:g})")


def server_names(cfg: RunConfig, parts: list[str]) -> list[str]:
    """The servers to search: batchlab serve once per strategy of the config, then the baselines."""
    ours = [f"batchlab serve {s}" for s in cfg.strategies] if "batchlab" in parts else []
    return ours + [n for n in SERVERS[1:] if n in parts]


def alternate(names: list[str], repeat: int) -> list[str]:
    """The servers' order in repeat `repeat` (0-based): reversed every other repeat (A B, B A, A B,
    ...), so a machine that drifts over the run does not always favour the same server."""
    return list(names) if repeat % 2 == 0 else list(reversed(names))


def next_bracket(res: dict, start: tuple[float, float]) -> tuple[float, float]:
    """The next repeat starts from this one's final bracket (two points when the knee has not
    moved); from the starting bracket again when this one found no bracket."""
    lo, hi = res.get("sustained_rate"), res.get("failed_rate")
    return (lo, hi) if lo is not None and hi is not None else start


# --- one server -----------------------------------------------------------------------------------
def batchlab_command(strategy: str, s: Settings) -> list[str]:
    """`batchlab serve` for one strategy on the comparison's config, port and queue bound."""
    return process.serve_command(PORT, strategy, s.config, s.overrides, "tiny", "--max-queue", str(s.max_queue))


@contextmanager
def serving(name: str, s: Settings) -> Iterator[tuple[OpenAIBackend, str, tuple[str, ...]]]:
    """Start one server (on the servers' cores), yield (client backend, /metrics URL, series to
    sample), stop it however the block ends."""
    if name.startswith("batchlab serve "):
        strategy = name.removeprefix("batchlab serve ")
        cmd = batchlab_command(strategy, s)
        url = f"http://127.0.0.1:{PORT}/v1"
        with process.managed(f"batchlab-serve-{strategy}", cmd, url, "tiny", cpus=s.cpus, wait_s=300):
            yield OpenAIBackend(url, "tiny", timeout_s=s.timeout), metrics_url(url), SERIES["batchlab"]
        return
    with vllm.managed(name, "tiny", vllm.DEFAULT_PORTS[name], s.venv, 1024, "float32", 400, s.cpus) as running:
        text = name == "transformers"     # transformers serve takes text prompts and no ignore_eos
        backend = OpenAIBackend(running.url, running.model, timeout_s=s.timeout, prompt_format="text" if text else "tokens",
                                length_control="generation_config" if text else "ignore_eos")
        yield backend, metrics_url(running.url), SERIES.get(name, ())


def sent(backend: OpenAIBackend, trace: list[TraceItem]) -> list[Request]:
    """`trace` sent through the client on the wall clock; its requests, stamped."""
    clock = RealClock()
    return clock.run(backend.run_trace(trace, clock))[0]


def saturated(backend: OpenAIBackend, n: int, prompt_len: int, output_len: int) -> dict:
    """`n` requests sent at once (the same trace for every server), and the burst's figures
    (core/sustain.py burst_figures: tok/s and req/s in its steady middle, where the queue never
    empties; median TPOT and TTFT over the finished; how many did not finish), with the engine
    steps the server took for it where its /metrics count them (`steps`, and `step_sizes`: how
    many fell in each bucket of the figure it counts per step; the twin's replay counts its own, so
    a difference in how the two schedule shows apart from what each step costs)."""
    before = engine_steps(backend.base_url)
    figures = {"requests": n} | burst_figures(sent(backend, fixed_burst(n, prompt_len, output_len)))
    after = engine_steps(backend.base_url) if before is not None else None
    return figures | (steps_between(before, after) if before is not None and after is not None else {})


def probe(name: str, backend: OpenAIBackend, cfg: RunConfig, rate: float) -> dict:
    """One seeded Poisson point at `rate` through the client, judged (core/sustain.py judge)."""
    s, reqs = open_loop(backend, cfg.traffic, rate, cfg.slo)
    lo = cfg.traffic.warmup_s
    v = judge(reqs, lo, lo + cfg.traffic.duration_s, cfg.slo).record()
    click.echo(f"  {name:<26} {rate:6g} req/s  {s['throughput_tok_s']:6.0f} tok/s  served {v['served_share']:6.1%}  "
               f"TTFT p50/p99 {s['ttft_p50'] * 1e3:7.1f}/{s['ttft_p99'] * 1e3:7.1f} ms (slope {v['ttft_slope']:+.3f} s/s)  "
               f"TPOT p99 {s['tpot_p99'] * 1e3:5.1f} ms  send-lag p99 {s['send_lag_p99'] * 1e3:6.1f} ms  "
               f"{'sustained' if v['sustained'] else 'NOT: ' + ', '.join(v['why'])}")
    return {k: s[k] for k in POINT_KEYS} | v


def search_server(name: str, backend: OpenAIBackend, cfg: RunConfig, bracket: tuple[float, float], s: Settings) -> dict:
    """Warm up, measure the saturated burst, then search the knee from `bracket` (max_points 0:
    the burst alone, for a quick paired throughput check); every point kept."""
    p, o = (round(d.mean()) for d in (cfg.traffic.prompt_len, cfg.traffic.output_len))   # the lengths or their means
    closed_loop(backend, WARMUP_USERS, 1, p, o)
    sat = saturated(backend, s.burst, p, o) if s.burst else None
    if sat:
        click.echo(f"  {name:<26} burst of {s.burst}: {sat['tok_s']:7.0f} tok/s, {sat['req_s']:6.1f} req/s saturated, "
                   f"failed {sat['failed']}")
    points: list[dict] = []

    def holds(rate: float) -> bool:
        points.append(probe(name, backend, cfg, rate))
        return points[-1]["sustained"]

    found = {"sustained_rate": None, "failed_rate": None, "probes": [], "settled": False}
    if s.max_points:
        b = knee(holds, *bracket, tolerance=s.tolerance, max_probes=s.max_points, snap=significant(3))
        found = {"sustained_rate": b.lo, "failed_rate": b.hi, "probes": [r for r, _ in b.probes], "settled": b.settled}
    if s.overload and found["sustained_rate"]:
        # NOTE: past the knee the rule's verdict is known (not sustained); what the point is for is
        # how much of the offered work the server still serves, and how late the client's sends go
        rate = significant(3)(s.overload * found["sustained_rate"])
        found["overload"] = probe(name, backend, cfg, rate) | {"factor": s.overload}
    return found | {"bracket_start": list(bracket), "points": points, "saturated": sat}


def run_repeat(name: str, s: Settings, cfg: RunConfig, bracket: tuple[float, float]) -> dict:
    """One server's repeat: start it, search, sample its memory, stop it. A server that cannot start
    or breaks is recorded with its error (the other servers still run)."""
    load = os.getloadavg()[0]
    try:
        with serving(name, s) as (backend, url, series):
            sampler = Peaks(url, series)
            sampler.start()
            try:
                res = search_server(name, backend, cfg, bracket, s)
            finally:
                memory = sampler.stop()
            if name == "vllm":
                res["kv_pool"] = vllm.kv_cache_usage(backend.base_url)
    except Exception as e:  # noqa: BLE001 - a server that cannot start or breaks is reported, not fatal
        click.echo(f"  {name}: could not run: {e}")
        return {"error": str(e).splitlines()[0][:300] if str(e) else type(e).__name__, "load_1min_before": load}
    return res | {"memory": memory, "load_1min_before": load}


# --- every server, and the report -----------------------------------------------------------------
def search_all(s: Settings, cfg: RunConfig, names: list[str], report: dict, out: Path) -> None:
    """Every server's searches, repeat by repeat, in alternating order; saved after each server."""
    entries = {n: {"server": n, "repeats": []} for n in names}
    report["servers"] = list(entries.values())
    brackets = dict.fromkeys(names, s.bracket)
    for rep in range(s.sustain_repeats):
        order = alternate(names, rep)
        report["order"].append(order)
        click.echo(f"repeat {rep + 1}/{s.sustain_repeats}: {' then '.join(order)}")
        for name in order:
            res = run_repeat(name, s, cfg, brackets[name])
            entries[name]["repeats"].append(res | {"repeat": rep, "position": order.index(name)})
            brackets[name] = next_bracket(res, s.bracket)
            save(report, out)


def header(s: Settings, cfg: RunConfig, command: str) -> dict:
    """The report before anything runs: how it was made and the rule each point is judged by."""
    t = cfg.traffic
    return {"command": command, "cpus": os.cpu_count(), "pinned": bool(s.cpus),
            "load_avg_1_5_15": {"before": list(os.getloadavg())},
            "trace": {"arrival": t.arrival, "duration_s": t.duration_s, "warmup_s": t.warmup_s,
                      "prompt_len": t.prompt_len.value, "output_len": t.output_len.value},
            "slo": {k: v for k, v in cfg.slo.model_dump().items() if v},
            "rule": {"served": SERVED, "growth_s_per_s": GROWTH, "tolerance": s.tolerance,
                     "bracket_start": list(s.bracket), "max_points": s.max_points, "burst": s.burst,
                     "max_queue": s.max_queue},
            "sustain_repeats": s.sustain_repeats, "order": [], "servers": []}


def carry_over(path: Path, report: dict, parts: list[str]) -> None:
    """Parts not measured this time (overhead, loadgen) stay from the result file they were
    measured for, with that run's command and load, so the file says where each came from."""
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    for part in ("overhead", "loadgen"):
        if part not in parts and part in old:
            report[part] = old[part]
            report.setdefault("carried", {})[part] = old.get("carried", {}).get(part) or {
                "command": old["command"], "load_avg_1_5_15": old["load_avg_1_5_15"]}


def save(report: dict, path: Path) -> None:
    """Rewritten after every server, so a crash late in the run keeps what was measured."""
    report["load_avg_1_5_15"]["after"] = list(os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(report, indent=2, default=str) + "\n")
