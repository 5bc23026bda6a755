"""Numbers for people: one set of rules that the verdict, report.md/html and the console share.

Three significant figures, thousands separators, units on every quantity ("0.714 req/s",
"50 ms", "8.3 %"), changes as signed whole percentages ("−80%"), and words instead of NaN or
inf: a number that cannot be shown is "—" in a cell and never reaches a sentence (the callers
check first). Full precision stays in the CSV files; these strings are for reading.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

DASH = "—"


def num(x: float, sig: int = 3) -> str:
    """'0.714', '5.41', '20', '1,768' (no exponent; integers of four digits or more in full)."""
    if x is None or not math.isfinite(x):
        return DASH
    if abs(x) >= 10 ** sig:
        return f"{x:,.0f}"
    if x == 0:
        return "0"
    digits = max(sig - 1 - math.floor(math.log10(abs(x))), 0)
    text = f"{round(x, digits):.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# NOTE: with traffic.sessions a sweep's rate counts conversations started per second, each of
# several requests, and in a closed loop (traffic.arrival: closed) it counts users; every sentence
# and title that names a rate must say so (see rate_unit).
RATE_UNIT: ContextVar[str] = ContextVar("rate_unit", default="req/s")


def unit_of(traffic: dict | None) -> str:
    """The unit of a sweep's rates: 'users' for a closed loop, 'sessions/s' for multi-turn session
    traffic, else 'req/s' (TrafficConfig.load_unit, from a config.yaml's traffic section)."""
    traffic = traffic or {}
    return "users" if traffic.get("arrival") == "closed" else "sessions/s" if traffic.get("sessions") else "req/s"


def load_axis() -> str:
    """The x-axis label of a plot against the sweep's load: 'arrival rate (req/s)' or, for a
    closed loop, 'concurrency (users)'."""
    unit = RATE_UNIT.get()
    return "concurrency (users)" if unit == "users" else f"arrival rate ({unit})"


@contextmanager
def rate_unit(unit: str) -> Iterator[None]:
    """Rates formatted inside this block carry `unit`."""
    token = RATE_UNIT.set(unit)
    try:
        yield
    finally:
        RATE_UNIT.reset(token)


def rate(x: float) -> str:
    """An arrival rate: '0.714 req/s', '20 req/s' ('2 sessions/s' inside rate_unit('sessions/s'))."""
    return f"{num(x)} {RATE_UNIT.get()}"


def seconds(x: float) -> str:
    """A duration: '50 ms' below a second, '1 s', '2.6 s' above."""
    if x is None or not math.isfinite(x):
        return DASH
    return f"{num(1000 * x)} ms" if abs(x) < 1 else f"{num(x)} s"


def share(frac: float) -> str:
    """A fraction as a percentage with one decimal: '8.3 %', '100 %', '61.4 %'."""
    if frac is None or not math.isfinite(frac):
        return DASH
    text = f"{100 * frac:.1f}"
    return f"{text.removesuffix('.0')} %"


def change(rel: float) -> str:
    """A relative change as a signed whole percentage: '+115%', '−80%'. NOTE: round() first, so
    −0.4 % prints +0% rather than −0%."""
    if rel is None or not math.isfinite(rel):
        return DASH                      # relative to zero (e.g. a goodput of 0): no percentage
    return f"{round(100 * rel):+d}%".replace("-", "−")


def ratio(x: float) -> str:
    """'4×', '2.5×', '1.33×'."""
    return f"{num(x)}×"


def repeats(n: int) -> str:
    """'median of 1 repeat', 'medians of 3 repeats'."""
    return "median of 1 repeat" if n == 1 else f"medians of {n} repeats"


def count(n: int, noun: str) -> str:
    """'1 request', '2,971 requests'."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def listing(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c' ('' for none)."""
    if not items:
        return ""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
