"""What a setting serves when its queue never empties: a burst of the config's own requests
arriving at once, run through the same simulator, its steady middle measured
(core/sustain.saturated_rate). The searches hold a rate only below it (core/sustain.stable)."""
from __future__ import annotations

from batchlab.core.config import RunConfig
from batchlab.core.sustain import saturated_rate
from batchlab.core.traffic import burst_trace
from batchlab.schedulers import scheduler_class


def burst_size(cfg: RunConfig, strategy: str) -> int:
    """Eight full batches per replica (at least 400): enough for a steady middle to measure."""
    return min(20_000, max(400, 8 * scheduler_class(strategy).batch_rows(cfg) * cfg.backend.replica_count()))


def saturated(cfg: RunConfig, strategy: str, backend=None, n: int | None = None) -> float:
    """Requests per second `strategy` completes under `cfg` with a queue that never empties, from a
    burst of `n` requests (default `burst_size`); NaN where a burst means nothing (sessions: turns
    wait for answers; a replayed trace)."""
    from batchlab.backends import make_backend
    from batchlab.run.point import run_point
    if cfg.traffic.sessions is not None or cfg.traffic.arrival == "trace":
        return float("nan")
    rate, trace = burst_trace(cfg.traffic, n or burst_size(cfg, strategy))
    res = run_point(cfg, strategy, rate, 0, backend or make_backend(cfg), trace)
    return saturated_rate(res.requests)
