"""The one rule for "this setting holds its traffic": the report's knee, the tuner's checks and
the capacity search all ask it here (report/, tune/ and calibrate/ are siblings and may not import
each other, so the rule lives below them).

A point sustains its rate when both hold:
- the SLO: at least ATTAINMENT of its measured requests meet every threshold (only when an SLO is set);
- the throughput: requests completed per second reach SERVED x the rate offered, where the offered
  rate is measured from the arrivals ((n - 1) over their span), not taken from the config.
NOTE: the second condition is what catches a growing queue: its latency percentiles can still look
fine (TPOT does not see queueing at all) while a backlog builds that is served after traffic stops.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ATTAINMENT = 0.90        # a point "meets the SLO" when this share of its requests meets it
SERVED = 0.95            # completed / offered requests per second that counts as keeping up


def offered_rate(arrivals: Sequence[float] | np.ndarray) -> float:
    """Requests offered per second: (n - 1) arrivals over the span of the measured arrivals
    (NaN with fewer than two, or all at one instant)."""
    a = np.asarray(arrivals, dtype=float)
    if len(a) < 2:
        return float("nan")
    span = float(a.max() - a.min())
    return (len(a) - 1) / span if span > 0 else float("nan")


def sustains(attainment, served, with_slo):
    """Whether a point (or, element-wise, a Series of points) holds its traffic: `served` is
    completed over offered requests per second, `attainment` the share meeting every SLO threshold."""
    ok = served >= SERVED
    return ok & (attainment >= ATTAINMENT) if with_slo else ok
