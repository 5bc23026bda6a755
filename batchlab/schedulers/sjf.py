"""Shortest job first on the continuous machinery, with an aging cap so nothing starves.

Admission takes the waiting request with the least predicted remaining output; one that has
waited `aging_s` since it arrived goes ahead of every younger request (first come, first served
among the aged), so a long job waits at most the aging cap plus the time to serve the older ones.
Out of KV blocks, the running request with the most predicted remaining output is preempted.
It never preempts to make way for a shorter request: measured on benchmarks/policies.py's mix,
doing so (shortest remaining first) cut mean E2E less and doubled p99, as long jobs were
preempted and recomputed again and again.
The predictor is the true length (`oracle`) or a noisy guess: true x exp(sigma Z), Z ~ N(0, 1),
seeded per request, with sigma set so the mean absolute relative error is `error`.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from batchlab.core.config import Model
from batchlab.core.limits import MAX_SECONDS
from batchlab.core.request import Request
from batchlab.schedulers.queues import KeyedAdmission, KeyedQueue


class SJFConfig(Model):
    """Shortest predicted remaining output first, with an aging cap: a request that has waited
    `aging_s` goes ahead of every younger one (first come, first served among the aged)."""
    aging_s: Annotated[float, Field(gt=0, le=MAX_SECONDS)] = 5.0
    """Seconds of waiting after which a request goes ahead of every younger one."""
    predictor: Literal["oracle", "noisy"] = "oracle"
    """oracle: the true output length; noisy: a seeded guess."""
    error: Annotated[float, Field(gt=0, le=10)] = 0.5
    """noisy: the guess's mean absolute relative error."""
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    """noisy: the predictor's own seed."""


class SJFScheduler(KeyedAdmission):
    name, options_model, runs_under = "sjf", SJFConfig, ("continuous",)
    title, short, color, compared_with = "Shortest-job-first", "SJF", "#56B4E9", "continuous"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sigma = sigma_for_error(self.options.error) if self.options.predictor == "noisy" else None
        self.by_age = KeyedQueue()               # the same waiting requests, oldest first

    def predicted(self, r: Request) -> int:
        """Predicted output length, made once per request (the same on every backend)."""
        if r.predicted_output is None:
            r.predicted_output = r.max_new_tokens
            if self.sigma is not None:
                z = np.random.default_rng([self.options.seed, r.index, r.turn or 0]).standard_normal()
                r.predicted_output = max(1, round(r.max_new_tokens * math.exp(self.sigma * z)))
        return r.predicted_output

    def remaining(self, r: Request) -> int:
        return max(self.predicted(r) - len(r.token_times), 0)

    def order_key(self, r: Request) -> tuple:
        return self.remaining(r), r.arrival_time, r.index

    def add(self, request: Request) -> None:
        super().add(request)
        self.by_age.push(request, (request.arrival_time, request.index))

    def _preempt(self, victim: Request) -> None:
        super()._preempt(victim)
        self.by_age.push(victim, (victim.arrival_time, victim.index))

    def next_waiting(self, now: float) -> Request:
        oldest = self.by_age.peek()
        if now - oldest.arrival_time >= self.options.aging_s:
            return oldest                      # aged: first come, first served
        return self.order.peek()

    def _take(self, r: Request) -> None:
        super()._take(r)
        self.by_age.discard(r)

    def abort(self, request: Request) -> bool:
        gone = super().abort(request)
        if gone:
            self.by_age.discard(request)
        return gone

    def victim(self) -> Request:
        return max(self.running, key=lambda r: (self.remaining(r), r.arrival_time, r.index))


def sigma_for_error(error: float) -> float:
    """sigma with E|exp(sigma Z) - 1| = error, Z standard normal. That mean is
    exp(sigma^2 / 2) (2 Phi(sigma) - 1), increasing in sigma: solved by bisection."""
    def mare(s: float) -> float:
        return math.exp(s * s / 2) * math.erf(s / math.sqrt(2))
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mare(mid) < error else (lo, mid)
    return (lo + hi) / 2
