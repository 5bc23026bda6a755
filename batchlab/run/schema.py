"""The CSV schema of a results directory: one row per request (REQUEST_COLUMNS) in requests.csv,
one row per point in summary.csv (`summary_row`), every row carrying the run's settings, and the
canonical order points are written in."""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from batchlab.core.breakdown import PHASES
from batchlab.core.config import STRATEGY_PATTERN, RunConfig
from batchlab.core.metrics import per_request, prompt_tokens
from batchlab.core.request import Request
from batchlab.run.experiment import knobs, point_hash
from batchlab.run.strategies import rank

REQUEST_COLUMNS = [
    "request_id", "strategy", "rate", "repeat", "seed", "backend", "model", "knobs", "point_hash",
    "status", "error", "warmup", "prompt_len", "output_len", "max_new_tokens",
    "arrival_time", "scheduled_time", "first_token_time", "completion_time",
    "queue_wait", "ttft", "tpot", "e2e", "itl_max", "num_preemptions", "trigger",
    *PHASES,
    "session_id", "turn", "prefix_group",     # traffic.sessions / traffic.prefix; empty for plain traffic
    "cached_prompt_tokens", "computed_prompt_tokens",
    "class", "tenant", "priority",            # traffic.classes; empty for plain traffic
]
KEY = ("strategy", "rate", "repeat")
LEDGER = ("num_rows", "rows_digest")      # the last two columns of a summary row: its request rows' count and digest
Key = tuple[str, float, int]
STRATEGY_NAME = re.compile(STRATEGY_PATTERN)


def canonical(key: Key) -> tuple:
    """The order points are written in: rate, then repeat, then strategy (naive, dynamic, ...)."""
    strategy, rate, repeat = key
    return rate, repeat, rank(strategy)


def cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(float(v))              # numpy floats repr as 'np.float64(...)'
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def summary_row(cfg: RunConfig, strategy: str, rate: float, repeat: int, model: str,
                summary: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One point's row of summary.csv: its key and settings, the metrics, its cost where the
    backend is priced, then backend facts."""
    return {"strategy": strategy, "rate": rate, "repeat": repeat, "seed": cfg.traffic.seed,
            "backend": cfg.backend.kind, "model": model, "point_hash": point_hash(cfg, strategy),
            **summary, **cost_columns(cfg, summary["throughput_tok_s"]), **(meta or {})}


def cost_columns(cfg: RunConfig, tok_s: float) -> dict[str, float]:
    """GPUs, $ per hour, output tokens/s per GPU and $ per million output tokens at the point's
    throughput (its rate's, below saturation: what the traffic costs on this setting, idle time
    included); {} for a backend with no price."""
    price = cfg.backend.pricing()
    if price is None:
        return {}
    gpus = cfg.backend.replica_count() * price.gpus_per_replica
    usd_h = gpus * price.usd_per_gpu_hour
    return {"gpus": gpus, "usd_per_hour": usd_h, "tok_s_per_gpu": tok_s / gpus,
            "usd_per_m_tokens": usd_h / (3600 * tok_s) * 1e6 if tok_s > 0 else float("nan")}


def request_rows(cfg: RunConfig, strategy: str, rate: float, repeat: int, requests: list[Request],
                 model: str) -> list[dict]:
    common = {"strategy": strategy, "rate": rate, "repeat": repeat, "seed": cfg.traffic.seed,
              "backend": cfg.backend.kind, "model": model, "point_hash": point_hash(cfg, strategy),
              "knobs": ";".join(f"{k}={v}" for k, v in knobs(cfg, strategy).items())}
    rows = []
    for r in requests:
        m = per_request(r)
        gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
        row = common | m | {
            "request_id": r.request_id, "status": r.status.value, "error": r.error or "",
            "warmup": r.arrival_time < cfg.traffic.warmup_s, "prompt_len": r.prompt_len,
            "output_len": r.output_len, "max_new_tokens": r.max_new_tokens,
            "arrival_time": r.arrival_time, "scheduled_time": r.scheduled_time,
            "first_token_time": r.first_token_time, "completion_time": r.completion_time,
            "itl_max": max(gaps) if gaps else None, "num_preemptions": r.num_preemptions,
            "trigger": r.trigger, "session_id": r.session_id, "turn": r.turn, "prefix_group": r.prefix_group,
            "class": r.klass, "tenant": r.tenant, "priority": r.priority if r.klass is not None else None,
            **prompt_tokens(r),
        }
        for phase in PHASES:
            row[phase] = r.breakdown.get(phase, 0.0 if r.status.value == "finished" else None)
        rows.append({k: cell(row.get(k)) for k in REQUEST_COLUMNS})
    return rows
