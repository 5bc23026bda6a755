"""The one rule for "this setting holds its traffic". report/, tune/, calibrate/ and baselines/ are
siblings that may not import each other, so the rule lives below them and each asks it here.

A point sustains its rate when at least ATTAINMENT of its requests meet every SLO threshold and the
work completed reaches SERVED of the work offered (`sustains`: the report's knee, the tuner, the
capacity search); a search that simulates its points also asks that the rate be below what the
setting completes with a queue that never empties (`stable`). One point judged alone (`judge`: a
live server's probe) must also show no failure, p99s within the SLO and no growing wait (GROWTH).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from batchlab.core.config import SLOConfig
from batchlab.core.metrics import measured, summarize
from batchlab.core.request import Request, Status

ATTAINMENT = 0.90        # a point "meets the SLO" when this share of its requests meets it
SERVED = 0.95            # completed / offered requests per second that counts as keeping up
GROWTH = 0.1             # s of wait gained per s of arrivals: above this the queue only grows


def served_share(requests: Iterable[Request], lo: float, hi: float) -> float:
    """Output tokens stamped inside [lo, hi) over the output tokens asked for by requests that
    arrived inside it: ~1 when the backend keeps up, < 1 while a queue builds (NaN if none arrived).
    NOTE: a window measure, for searches that choose their own points: summary.csv's requests_per_s
    (the report's measure) runs from the first arrival to the last completion, so it also counts
    the drain after traffic stops and reads low when an E2E is a large share of the point."""
    served, offered = _window_tokens(requests, lo, hi)
    return served / offered if offered else float("nan")


def _window_tokens(requests: Iterable[Request], lo: float, hi: float) -> tuple[int, int]:
    """Output tokens stamped inside [lo, hi), and those asked for by the requests that arrived in it."""
    requests = list(requests)
    offered = sum(r.max_new_tokens for r in requests if lo <= r.arrival_time < hi)
    served = sum(int(np.count_nonzero((np.asarray(r.token_times) >= lo) & (np.asarray(r.token_times) < hi)))
                 for r in requests)
    return served, offered


def _steady_middle(requests: Iterable[Request]) -> list[tuple[float, int]] | None:
    """The burst's finished requests as (completion time, output tokens), in completion order,
    from its 20th to its 80th percentile completion (the start fills the batch, the end drains
    it); None with fewer than 10 finished."""
    done = sorted((r.token_times[-1], r.output_len) for r in requests
                  if r.status.value == "finished" and r.token_times)
    n = len(done)
    return done[n // 5:4 * n // 5 + 1] if n >= 10 else None


def _per_second(middle: list[tuple[float, int]] | None, count) -> float:
    """`count` of the completions after the middle's first, over the middle's length."""
    if middle is None:
        return float("nan")
    span = middle[-1][0] - middle[0][0]
    return count(middle[1:]) / span if span > 0 else float("inf")


def saturated_rate(requests: Iterable[Request]) -> float:
    """Requests completed per second by a burst that arrived at once, in its steady middle
    (`_steady_middle`). NaN with fewer than 10 finished."""
    return _per_second(_steady_middle(requests), len)


def saturated_tokens(requests: Iterable[Request]) -> float:
    """Output tokens per second of a burst in the same steady middle as `saturated_rate`: the
    tokens of the requests that completed in it over its length."""
    return _per_second(_steady_middle(requests), lambda done: sum(k for _, k in done))


def burst_figures(requests: list[Request]) -> dict[str, float]:
    """A saturated burst's figures, live or simulated alike: steady-middle output tok/s and req/s,
    median TPOT and TTFT over its finished requests, how many did not finish, and the median gap
    between two tokens of any finished request (`gap_p50`): every running row gets a token each
    step, and most of a burst's steps only decode, so this is its typical decode step, where TPOT
    also carries the steps that computed others' prompts."""
    s = summarize(requests)
    gaps = [np.diff(r.token_times) for r in requests if r.status.value == "finished" and len(r.token_times) > 1]
    return {"tok_s": saturated_tokens(requests), "req_s": saturated_rate(requests), "tpot_p50": s["tpot_p50"],
            "ttft_p50": s["ttft_p50"], "failed": s["failed"] + s["unfinished"],
            "gap_p50": float(np.median(np.concatenate(gaps))) if gaps else float("nan")}


def makespan_rate(requests: Iterable[Request]) -> float:
    """Requests completed per second by a burst that arrived at once, over its whole span (first
    arrival to last completion): the measure for a burst of a batch or two, whose requests finish
    together and so leave no steady middle to measure. NaN when none finished."""
    requests = list(requests)
    ends = [r.token_times[-1] for r in requests if r.status is Status.FINISHED and r.token_times]
    span = max(ends, default=math.nan) - min(r.arrival_time for r in requests) if ends else math.nan
    return len(ends) / span if span > 0 else math.nan


def stable(rate: float, saturated: float) -> bool:
    """The queue does not grow: `rate` is below `saturated` (no verdict, so True, when NaN).
    NOTE: `sustains` lets through a queue that grows by less than 1 - SERVED of what arrives; below
    the saturated rate a queue drains, above it it grows without bound, however slowly."""
    return bool(saturated != saturated or rate < saturated)


def sustains(attainment, served, with_slo):
    """Whether a point (or, element-wise, a Series of points) holds its traffic: `served` is
    completed over offered requests per second (the report) or `served_share` over the measured
    window (the searches), `attainment` the share meeting every SLO threshold.
    NOTE: `served` is what catches a growing queue: latency percentiles can still look fine (TPOT
    does not see queueing at all) while a backlog builds that is served after traffic stops."""
    ok = served >= SERVED
    return ok & (attainment >= ATTAINMENT) if with_slo else ok


def ttft_slope(requests: Iterable[Request], since: float) -> float:
    """Seconds of TTFT gained per second of arrival time: the least-squares slope over the finished
    requests that arrived from `since` on (NaN with fewer than three).
    NOTE: TTFT stands for the queue wait, because a client never sees when a server admits a request:
    TTFT is that wait plus one prefill, and its trend is the queue's."""
    done = [(r.arrival_time, r.token_times[0] - r.arrival_time) for r in requests
            if r.status is Status.FINISHED and r.token_times and r.arrival_time >= since]
    return queue_slope(*zip(*done)) if len(done) > 2 else float("nan")


def queue_slope(arrivals, waits) -> float:
    """The slope of a least-squares line through (arrival time, wait): above GROWTH the queue grows."""
    return float(np.polyfit(np.asarray(arrivals, dtype=float), np.asarray(waits, dtype=float), 1)[0])


def slo_misses(summary: dict, slo: SLOConfig) -> list[str]:
    """The SLO limits a point's p99 misses, TPOT, TTFT and E2E (TTFT matters: a server that sends a
    whole answer at once has a TPOT near zero on the client, whatever its batches cost)."""
    checks = [("TPOT p99", slo.tpot_s, summary["tpot_p99"]), ("TTFT p99", slo.ttft_s, summary["ttft_p99"]),
              ("E2E p99", slo.e2e_s, summary["e2e_p99"])]
    return [name for name, limit, value in checks if limit is not None and not value <= limit]


@dataclass(frozen=True)
class Verdict:
    """Whether one point sustains its rate, and why not (`why` is empty when it does)."""
    served_share: float              # `served_share` over the measured window
    window_tok_s: float              # output tokens stamped per second of the measured window
    ttft_slope: float                # `ttft_slope` of the measured requests
    why: tuple[str, ...]

    @property
    def sustained(self) -> bool:
        return not self.why

    def record(self) -> dict:
        """As a result file keeps it."""
        return {"served_share": self.served_share, "window_tok_s": self.window_tok_s, "ttft_slope": self.ttft_slope,
                "sustained": self.sustained, "why": list(self.why)}


def judge(requests: Iterable[Request], lo: float, hi: float, slo: SLOConfig = SLOConfig(),
          rate: float = math.nan, saturated: float = math.nan) -> Verdict:
    """One point's verdict from its requests, measured over the window [lo, hi): no request of those
    arriving from `lo` on failed, their p99s within the SLO (`slo_misses`), the work served in the
    window at least SERVED of the work offered in it, TTFT not growing faster than GROWTH s/s, and
    `rate` below the `saturated` rate where one was measured (`stable`).
    NOTE: p99s, not the report's ATTAINMENT share: a sweep's point is read over repeats, where a
    share is steady; a live probe is one run, and its tail is what a user of that rate would see."""
    requests = list(requests)
    s = summarize(measured(requests, lo))
    served, offered = _window_tokens(requests, lo, hi)
    share = served / offered if offered else float("nan")
    slope = ttft_slope(requests, lo)
    why = [f"{s['failed'] + s['unfinished']} failed"] if s["failed"] or s["unfinished"] else []
    why += slo_misses(s, slo)
    if not share >= SERVED:
        why.append(f"served {100 * share:.1f} %")
    if slope > GROWTH:
        why.append(f"queue growing {slope:.2f} s/s")
    if not (math.isnan(rate) or stable(rate, saturated)):
        why.append(f"at or above the {saturated:.4g} req/s it completes saturated")
    return Verdict(share, served / (hi - lo), slope, tuple(why))
