"""Every metric, computed from request timestamps, here and nowhere else (seed question 0.5).

Per request: queue wait = scheduled - arrival; TTFT = first token - arrival (queue time is
part of what a user waits for); TPOT = (completion - first token) / (n - 1); E2E = completion -
arrival; ITL = every gap between consecutive tokens.
Per run (requests that arrived after warm-up): throughput = output tokens / (last completion -
first arrival); goodput = requests meeting every SLO threshold per second of that window;
Little's law: the time-average number of requests in the system, measured from the stamps,
against arrival rate x mean E2E.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchlab.core.config import SLOConfig
from batchlab.core.request import Request, Status

PERCENTILES = (50, 90, 95, 99)


def per_request(r: Request) -> dict[str, float | None]:
    """Latencies of one request in seconds; None where a stamp is missing."""
    first, last = r.first_token_time, r.completion_time
    n = r.output_len
    return {
        "queue_wait": None if r.scheduled_time is None else r.scheduled_time - r.arrival_time,
        "ttft": None if first is None else first - r.arrival_time,
        "tpot": (last - first) / (n - 1) if last is not None and n > 1 else None,
        "e2e": None if last is None else last - r.arrival_time,
    }


@dataclass(frozen=True, slots=True)
class Response:
    """What a caller receives: a frozen snapshot with the derived per-request metrics (seconds)."""
    request_id: str
    status: Status
    output_text: str
    output_token_ids: tuple[int, ...]
    prompt_len: int
    output_len: int
    queue_wait: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    error: str | None = None

    @classmethod
    def of(cls, r: Request) -> "Response":
        m = per_request(r)
        return cls(r.request_id, r.status, r.output_text, tuple(r.output_token_ids), r.prompt_len,
                   r.output_len, m["queue_wait"], m["ttft"], m["tpot"], m["e2e"], r.error)


def meets_slo(m: dict[str, float | None], slo: SLOConfig) -> bool:
    for key, limit in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s)):
        if limit is not None and (m[key] is None or m[key] > limit):
            return False
    return True


def _pcts(values: Iterable[float], name: str) -> dict[str, float]:
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    out = {}
    for q in PERCENTILES:
        out[f"{name}_p{q}"] = float(np.percentile(arr, q)) if arr.size else float("nan")
    out[f"{name}_mean"] = float(arr.mean()) if arr.size else float("nan")
    return out


def measured(requests: Iterable[Request], warmup_end: float) -> list[Request]:
    """Requests that count: those that arrived after warm-up."""
    return [r for r in requests if r.arrival_time >= warmup_end]


def summarize(requests: list[Request], slo: SLOConfig = SLOConfig()) -> dict[str, Any]:
    """Per-run aggregates over already-filtered requests (see `measured`)."""
    ok = [r for r in requests if r.status is Status.FINISHED]
    rows = [per_request(r) for r in ok]
    out: dict[str, Any] = {"num_requests": len(requests), "finished": len(ok),
                           "failed": sum(r.status is Status.FAILED for r in requests),
                           "unfinished": sum(not r.is_done for r in requests)}
    window = _window(requests, ok)
    tokens = sum(r.output_len for r in ok)
    out["window_s"] = window
    out["throughput_tok_s"] = tokens / window if window > 0 else float("nan")
    out["requests_per_s"] = len(ok) / window if window > 0 else float("nan")
    good = sum(meets_slo(m, slo) for m in rows)
    out["goodput"] = good / window if window > 0 else float("nan")
    out["slo_attainment"] = good / len(requests) if requests else float("nan")
    for key in ("queue_wait", "ttft", "tpot", "e2e"):
        out |= _pcts((m[key] for m in rows), key)
    out |= _pcts(_itls(ok), "itl")
    out |= littles_law(requests, ok, window)
    out["mean_output_len"] = tokens / len(ok) if ok else float("nan")
    out["preemptions"] = sum(r.num_preemptions for r in requests)
    return out


def _window(requests: list[Request], ok: list[Request]) -> float:
    if not ok:
        return 0.0
    start = min(r.arrival_time for r in requests)
    return max(r.completion_time for r in ok) - start


def _itls(ok: list[Request]) -> np.ndarray:
    gaps = [np.diff(r.token_times) for r in ok if r.output_len > 1]
    return np.concatenate(gaps) if gaps else np.empty(0)


def littles_law(requests: list[Request], ok: list[Request], window: float) -> dict[str, float]:
    """L measured as the time-average of requests in the system over the window, vs lambda x W."""
    if not ok or window <= 0:
        return {"little_L": float("nan"), "little_lambda_W": float("nan")}
    start = min(r.arrival_time for r in requests)
    end = start + window
    in_system = sum(min(r.completion_time, end) - max(r.arrival_time, start) for r in ok)
    lam = len(requests) / window
    w = float(np.mean([r.completion_time - r.arrival_time for r in ok]))
    return {"little_L": in_system / window, "little_lambda_W": lam * w}


def batch_sizes(requests: Iterable[Request]) -> np.ndarray:
    """Sizes of request-level batches, recovered from shared scheduled stamps."""
    from collections import Counter
    counts = Counter(r.scheduled_time for r in requests if r.scheduled_time is not None)
    return np.asarray(sorted(counts.values()), dtype=float)
