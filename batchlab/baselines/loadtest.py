"""`batchlab loadtest URL`: load any OpenAI-compatible server, closed- or open-loop.

Closed loop (`--concurrency 1,4,16,64`): that many users each send a request as soon as their
previous one finished, for --duration seconds per level (or --per-user requests each), the same
closed loop a sweep runs with traffic.arrival closed (core/closed_loop.py); throughput rises with
concurrency until the server saturates, and p95 latency shows what that costs. Open loop (`--rate`, `--arrival poisson|gamma`): a seeded trace
arrives at its planned times whatever the server does, which is how real users behave and the
only way to see a queue build. Both send through the OpenAI backend (one client, streaming,
chunk stamps, exact usage counts) and summarise with core/metrics; the open loop also reports
the generator's own arrival-time error (planned vs actual send), so its numbers can be trusted.
Before any load, GET /models checks the server answers and serves the model. The API key is read
from the environment (OPENAI_API_KEY, or the variable --api-key-env names), never from a flag.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np
from pydantic import ValidationError

from batchlab.backends.openai_client import OpenAIBackend, api_key, check_server, served_models
from batchlab.core.clock import RealClock
from batchlab.core.config import SLOConfig, TrafficConfig, format_error
from batchlab.core.files import write_atomic
from batchlab.core.limits import MAX_BATCH, MAX_LENGTH, MAX_REQUESTS_PER_POINT
from batchlab.core.metrics import summarize
from batchlab.core.request import Request
from batchlab.core.traffic import build_trace
from batchlab.errors import ConfigError, user_errors
from batchlab.run.point import rebased
from batchlab.run.results import check_location


def closed_loop(backend: OpenAIBackend, concurrency: int, per_user: int | None, prompt_len: int,
                output_len: int, duration_s: float = 10.0, seed: int = 0) -> dict[str, Any]:
    """`concurrency` users, each sending its next request the moment its answer ends
    (core/closed_loop.py, as a sweep with traffic.arrival closed does), for `duration_s` seconds or
    `per_user` requests each, whichever comes first. Throughput counts over the time the users were
    sending when they ran to the end, else over first send to last answer."""
    traffic = traffic_config(arrival="closed", concurrency=[concurrency], duration_s=duration_s, warmup_s=0.0,
                             seed=seed, prompt_len=prompt_len, output_len=output_len)
    clock = RealClock()
    requests, t0 = clock.run(backend.run_trace(build_trace(traffic, concurrency), clock, traffic, per_user))
    wall = max((r.token_times[-1] for r in requests if r.token_times), default=t0) - t0
    rebased(requests, t0)
    s = summarize(requests, window=(0.0, duration_s), closed=per_user is None)
    return {"concurrency": concurrency, "requests": len(requests), "failed": s["failed"], "wall_s": wall,
            "requests_per_s": s["requests_per_s"], "throughput_tok_s": s["throughput_tok_s"],
            "e2e_p50": s["e2e_p50"], "e2e_p95": s["e2e_p95"], "ttft_p50": s["ttft_p50"],
            "ttft_p95": s["ttft_p95"], "tpot_p50": s["tpot_p50"], "tpot_p95": s["tpot_p95"],
            "in_system_mean": s["little_L"], **_lags(backend),
            "errors": sorted({r.error for r in requests if r.error})[:3]}


def _lags(backend: OpenAIBackend) -> dict[str, float]:
    lags = backend.send_lags
    return {"send_lag_p99": float(np.percentile(lags, 99)) if lags else float("nan")}


def open_loop(backend: OpenAIBackend, traffic: TrafficConfig, rate: float,
              slo: SLOConfig = SLOConfig(), workers: int = 1) -> tuple[dict[str, Any], list[Request]]:
    """One seeded trace at `rate` req/s, sent by `workers` processes; summary plus the
    generator's send lag."""
    trace = build_trace(traffic, rate)
    if not trace:
        raise ConfigError(f"no arrivals in {traffic.duration_s:g} s at {rate:g} req/s: lengthen --duration")
    clock = RealClock()
    requests, t0 = clock.run(backend.run_trace(trace, clock, workers=workers))
    rebased(requests, t0)
    s = summarize([r for r in requests if r.arrival_time >= traffic.warmup_s], slo)
    return {"rate": rate, "arrival": traffic.arrival, "t0": t0, **s, **backend.point_facts(t0, s),
            "errors": sorted({r.error for r in requests if r.error})[:3]}, requests


def pick_model(url: str, model: str | None, key: str) -> str:
    """`model` if the server serves it (else ConfigError naming what it serves); without one,
    the first model the server lists."""
    if model:
        for w in check_server(url, model, key):
            click.echo(f"warning: {w}", err=True)
        return model
    served = served_models(url, key)
    if isinstance(served, str) or not served:
        raise ConfigError(f"cannot list models at {url}/models ({served or 'none listed'}); pass --model")
    return served[0]


def traffic_config(**kw) -> TrafficConfig:
    """The open loop's traffic, checked like a config's (finite, bounded, capped per point)."""
    try:
        return TrafficConfig(**kw)
    except ValidationError as e:
        raise ConfigError(format_error(e)) from None


def _ms(v: float) -> str:
    return f"{v * 1e3:8.1f}"


def print_closed(row: dict) -> None:
    click.echo(f"conc={row['concurrency']:3d}  e2e_p95={row['e2e_p95']:6.2f} s  throughput={row['requests_per_s']:6.1f} req/s "
               f"{row['throughput_tok_s']:8.0f} tok/s  ttft_p50={_ms(row['ttft_p50'])} ms  "
               f"tpot_p50={_ms(row['tpot_p50'])} ms  failed={row['failed']}")


def print_open(s: dict) -> None:
    click.echo(f"rate={s['rate']:.3g} req/s ({s['arrival']}): {s['finished']}/{s['num_requests']} finished, "
               f"{s['throughput_tok_s']:.0f} tok/s, {s['requests_per_s']:.1f} req/s")
    click.echo(f"  TTFT p50/p99 {_ms(s['ttft_p50'])} /{_ms(s['ttft_p99'])} ms   "
               f"TPOT p50/p99 {_ms(s['tpot_p50'])} /{_ms(s['tpot_p99'])} ms   E2E p99 {_ms(s['e2e_p99'])} ms")
    if "send_lag_p99" in s:
        flag = "  <- generator too slow: latencies include its delay" if s["send_lag_flag"] else ""
        click.echo(f"  send lag (planned -> sent) p50/p99/max {s['send_lag_p50'] * 1e3:.3f} / "
                   f"{s['send_lag_p99'] * 1e3:.3f} / {s['send_lag_max'] * 1e3:.3f} ms{flag}")
    for e in s["errors"]:
        click.echo(f"  error: {e}")


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--concurrency: expected comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1 or max(levels) > MAX_BATCH:
        raise ConfigError(f"--concurrency: levels must be from 1 to {MAX_BATCH:,}")
    return levels


@click.command("loadtest")
@click.argument("url")
@click.option("--model", default=None, help="Model name (default: the first one /v1/models lists).")
@click.option("--concurrency", default="1,4,16,64", show_default=True, help="Closed loop: users per level.")
@click.option("--per-user", default=None, type=click.IntRange(min=1, max=MAX_REQUESTS_PER_POINT),
              help="Closed loop: each user stops after this many requests (default: at --duration).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), multiple=True,
              help="Open loop: arrival rate in req/s (repeatable); replaces the closed loop.")
@click.option("--arrival", type=click.Choice(["poisson", "gamma", "constant"]), default="poisson", show_default=True)
@click.option("--burstiness", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Gamma shape: < 1 burstier than Poisson.")
@click.option("--duration", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds of arrivals (closed loop: per level, the users then wait out their answers).")
@click.option("--prompt-len", default=64, show_default=True, type=click.IntRange(min=1, max=MAX_LENGTH))
@click.option("--output-len", default=64, show_default=True, type=click.IntRange(min=1, max=MAX_LENGTH))
@click.option("--prompt-format", type=click.Choice(["tokens", "text"]), default="tokens", show_default=True)
@click.option("--length-control", type=click.Choice(["ignore_eos", "generation_config", "none"]),
              default="ignore_eos", show_default=True, help="generation_config for transformers serve.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0, min_open=True, max=86_400),
              help="Per-request timeout, seconds.")
@click.option("--api-key-env", default=None, metavar="NAME",
              help="Environment variable holding the API key (default: OPENAI_API_KEY if set).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1, max=64),
              help="Open loop: processes sending each rate's trace (request i by process i mod N).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the results as JSON here.")
@user_errors
def loadtest_cmd(url, model, concurrency, per_user, rate, arrival, burstiness, duration, prompt_len, output_len,
                 prompt_format, length_control, seed, timeout, api_key_env, workers, out) -> None:
    """Load an OpenAI-compatible server at URL (e.g. http://127.0.0.1:8000/v1)."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"URL must start with http:// or https://, got {url!r}")
    levels = [] if rate else _levels(concurrency)
    if workers > 1 and not rate:
        raise ConfigError("--workers: a closed loop is sent by one process; give --rate for an open loop")
    if levels and per_user and max(levels) * per_user > MAX_REQUESTS_PER_POINT:
        raise ConfigError(f"--concurrency x --per-user: {max(levels) * per_user:,} requests in one level; "
                          f"the limit is {MAX_REQUESTS_PER_POINT:,}")
    traffic = traffic_config(arrival=arrival, burstiness=burstiness, rates=list(rate), duration_s=duration,
                             warmup_s=0.0, seed=seed, prompt_len=prompt_len, output_len=output_len) if rate else None
    if out:                          # NOTE: before the load, not after it: a bad path must not cost the run
        check_location(Path(out).parent)
        if Path(out).is_dir():
            raise ConfigError(f"--out {out}: is a directory; name the JSON file to write")
    key = api_key(api_key_env, "--api-key-env")
    model = pick_model(url, model, key)
    backend = OpenAIBackend(url, model, api_key=key, timeout_s=timeout, prompt_format=prompt_format,
                            length_control=length_control)
    results: list[dict] = []
    if traffic is not None:
        for lam in rate:
            summary, _ = open_loop(backend, traffic, lam, workers=workers)
            print_open(summary)
            results.append(summary)
    else:
        for c in levels:
            row = closed_loop(backend, c, per_user, prompt_len, output_len, duration, seed)
            print_closed(row)
            results.append(row)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json.dumps(results, indent=2, default=str))
