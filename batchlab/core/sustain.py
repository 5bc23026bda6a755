"""The one rule for "this setting holds its traffic": the report's knee, the tuner's checks and
the capacity search all ask it here (report/, tune/ and calibrate/ are siblings and may not import
each other, so the rule lives below them).

A point sustains its rate when both hold:
- the SLO: at least ATTAINMENT of its measured requests meet every threshold (only when an SLO is set);
- the throughput: the work completed reaches SERVED x the work offered (the report: requests per
  second over the measured arrival rate; the searches: `served_share` over the measured window).
NOTE: the second condition is what catches a growing queue: its latency percentiles can still look
fine (TPOT does not see queueing at all) while a backlog builds that is served after traffic stops.
It still lets through a queue that grows by less than 1 - SERVED of what arrives, so the searches,
which simulate their settings, also ask `stable`: is the offered rate below the rate the setting
completes requests at when its queue never empties (`saturated_rate`, a burst in the same
simulator)? Below it a queue drains; above it, it grows without bound, however slowly.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from batchlab.core.request import Request

ATTAINMENT = 0.90        # a point "meets the SLO" when this share of its requests meets it
SERVED = 0.95            # completed / offered requests per second that counts as keeping up


def served_share(requests: Iterable[Request], lo: float, hi: float) -> float:
    """Output tokens stamped inside [lo, hi) over the output tokens asked for by requests that
    arrived inside it: ~1 when the backend keeps up, < 1 while a queue builds (NaN if none arrived).
    NOTE: a window measure, for searches that choose their own points: summary.csv's requests_per_s
    (the report's measure) runs from the first arrival to the last completion, so it also counts
    the drain after traffic stops and reads low when an E2E is a large share of the point."""
    requests = list(requests)
    offered = sum(r.max_new_tokens for r in requests if lo <= r.arrival_time < hi)
    served = sum(int(np.count_nonzero((np.asarray(r.token_times) >= lo) & (np.asarray(r.token_times) < hi)))
                 for r in requests)
    return served / offered if offered else float("nan")


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


def stable(rate: float, saturated: float) -> bool:
    """The queue does not grow: `rate` is below `saturated` (no verdict, so True, when NaN)."""
    return bool(saturated != saturated or rate < saturated)


def sustains(attainment, served, with_slo):
    """Whether a point (or, element-wise, a Series of points) holds its traffic: `served` is
    completed over offered requests per second, `attainment` the share meeting every SLO threshold."""
    ok = served >= SERVED
    return ok & (attainment >= ATTAINMENT) if with_slo else ok
