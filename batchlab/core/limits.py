"""Sane bounds on every number a config may hold, and the size of one sweep point.

Each bound is far above any real use and far below what would exhaust a machine; a value past
one is refused with the bound in the message (core/config.py applies them as pydantic types).
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

# Sane bounds. Each is far above any real use and far below what would exhaust a machine.
MAX_RATE = 100_000.0                  # req/s offered to one point
MIN_RATE = 1e-6                       # req/s (about one request in 12 days)
MAX_SECONDS = 604_800.0               # one week: durations, warm-up, SLOs, rate-step times
MAX_LENGTH = 1_048_576                # tokens in one prompt or one output (2^20)
MAX_BATCH = 65_536                    # requests in one batch or step
MAX_USERS = 65_536                    # closed-loop users in one point (traffic.concurrency)
MAX_REQUESTS_PER_POINT = 1_000_000    # ~1 KB of stamps and bookkeeping each: about 1 GB per point
MAX_TOKENS_PER_POINT = 200_000_000    # prompt + output tokens, expected: ids and stamps are 8+ bytes each
MAX_TRACE_ROWS = 10_000_000           # rows read from one production trace file (~50 bytes each kept while
                                      # reading); its window may keep at most MAX_REQUESTS_PER_POINT

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
Tokens = Annotated[int, Field(gt=0, le=MAX_LENGTH)]
BatchSize = Annotated[int, Field(gt=0, le=MAX_BATCH)]
Rate = Annotated[float, Field(gt=0, le=MAX_RATE)]


def check_point_size(requests: float, tokens: float, rate: float | None = None) -> None:
    """Refuse a point that would generate more than the caps allow (ValueError, one line)."""
    at = f" at {rate:g} req/s" if rate is not None else ""
    if requests > MAX_REQUESTS_PER_POINT:
        raise ValueError(f"a point{at} would generate about {requests:.3g} requests (warmup_s + duration_s, "
                         f"rate_step included); the limit is {MAX_REQUESTS_PER_POINT:,} requests per point: "
                         "lower traffic.rates or traffic.duration_s")
    if tokens > MAX_TOKENS_PER_POINT:
        raise ValueError(f"a point{at} would generate about {tokens:.3g} prompt + output tokens; the limit is "
                         f"{MAX_TOKENS_PER_POINT:,} tokens per point: shorten the lengths or the traffic")
