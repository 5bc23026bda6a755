"""Bracket and bisect: the highest rate at which a monotone test still holds, to a tolerance.

A search keeps a bracket: `lo`, the highest rate seen to hold below every rate seen to fail, and
`hi`, the lowest rate seen to fail. It opens on its two ends (the lower first: where it fails, the
upper would too), moves the bracket where they do not hold the answer (widening), then probes
`width` rates inside it per round (1: bisection; k probes run side by side: a (k+1)-section) until
hi / lo - 1 <= tolerance, the cap on probes is spent, or rounding leaves nothing new to try.
The search runs nothing itself: `next_round()` says what to probe and `record()` takes each verdict,
so a round's probes can go to an executor together; `knee()` drives it with a plain function.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


def significant(digits: int) -> Callable[[float], float]:
    """Rounding to `digits` significant figures: a probed rate reads as it would be typed."""
    return lambda rate: float(f"{rate:.{digits}g}")


def ladder(low: float, high: float, n: int, snap: Callable[[float], float] = significant(4)) -> list[float]:
    """n rates from low to high, evenly on a log scale (an opening round of n probes)."""
    return [snap(low * (high / low) ** (i / (n - 1))) for i in range(n)]


def inside(lo: float, hi: float, k: int, geometric: bool = False, snap: Callable[[float], float] = significant(4)) -> list[float]:
    """k rates evenly inside (lo, hi), by ratio when `geometric`: k = 1 is bisection."""
    if geometric:
        return [snap(lo * (hi / lo) ** ((i + 1) / (k + 1))) for i in range(k)]
    return [snap(lo + (hi - lo) * (i + 1) / (k + 1)) for i in range(k)]


@dataclass
class Bracket:
    """One search's settings and every (rate, held) it has recorded, in order.
    NOTE: midpoints are geometric by default because the tolerance is a ratio: a 2x bracket then
    settles to 10 % in three bisections wherever the answer lies (arithmetic ones need up to four).
    Widening moves by the bracket's own ratio, squared after every move (from 40-80: x2, x4, x16;
    from a 10 % bracket: x1.1, x1.21, x1.46), so an answer that moved far is reached in a few probes
    while the first move overshoots little (a rate far past capacity is slow to run and to drain)."""
    low: float
    high: float
    tolerance: float                 # settled when hi / lo - 1 is within this (0: only rounding stops it)
    width: int = 1                   # rates probed per round
    max_probes: int | None = None    # at most this many probes (None: no cap)
    geometric: bool = True           # midpoints by ratio (False: by difference)
    widen: bool = True               # move the bracket when its ends do not hold the answer (False: stop)
    snap: Callable[[float], float] = significant(4)
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high < math.inf:
            raise ValueError(f"need 0 < low < high (got {self.low:g}, {self.high:g})")
        if not 0 <= self.tolerance < math.inf or self.width < 1 or (self.max_probes is not None and self.max_probes < 1):
            raise ValueError(f"need tolerance >= 0, width >= 1, max_probes >= 1 (got {self.tolerance:g}, {self.width}, "
                             f"{self.max_probes})")

    @property
    def hi(self) -> float | None:
        """The lowest rate that failed (None: every rate probed held)."""
        return min((r for r, ok in self.probes if not ok), default=None)

    @property
    def lo(self) -> float | None:
        """The highest rate that held below every rate that failed (None: none did)."""
        hi = self.hi
        return max((r for r, ok in self.probes if ok and (hi is None or r < hi)), default=None)

    @property
    def settled(self) -> bool:
        """Both ends known and within the tolerance."""
        lo, hi = self.lo, self.hi
        return lo is not None and hi is not None and hi / lo - 1 <= self.tolerance

    def record(self, rate: float, held: bool) -> None:
        self.probes.append((rate, bool(held)))

    def next_round(self) -> list[float]:
        """The rates to probe next, in order (empty: the search is over)."""
        left = math.inf if self.max_probes is None else self.max_probes - len(self.probes)
        if self.settled or left <= 0:
            return []
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            rates = inside(lo, hi, self.width, self.geometric, self.snap)
        elif hi is None:
            opening = [r for r in ladder(self.low, self.high, max(2, self.width), self.snap) if not self._seen(r)]
            rates = opening[:self.width] if opening else self._moves(up=True)
        else:
            rates = self._moves(up=False)
        fresh = [r for r in dict.fromkeys(rates) if not self._seen(r)]
        return fresh[:int(min(left, len(fresh)))]

    def _seen(self, rate: float) -> bool:
        return any(r == rate for r, _ in self.probes)

    def _moves(self, up: bool) -> list[float]:
        """The next `width` moves of a bracket whose ends did not hold the answer: up from the highest
        rate (all held) or down from the lowest (none held), each move's ratio the square of the last's."""
        if not self.widen:
            return []
        ratio = self.high / self.low
        if up:
            rate, done = max(r for r, _ in self.probes), sum(r > self.high for r, _ in self.probes)
        else:
            rate, done = min(r for r, _ in self.probes), sum(r < self.low for r, _ in self.probes)
        out = []
        for n in range(done, done + self.width):
            rate = self.snap(rate * ratio ** (2 ** n) if up else rate / ratio ** (2 ** n))
            if not up and rate < self.low / 1000:       # NOTE: nothing held down to a thousandth of `low`
                break
            out.append(rate)
        return out


def knee(holds: Callable[[float], bool], low: float, high: float, **settings) -> Bracket:
    """The search run with `holds(rate)` (one probe after another; `settings` as `Bracket`'s)."""
    bracket = Bracket(low, high, **settings)
    while rates := bracket.next_round():
        for rate in rates:
            bracket.record(rate, holds(rate))
    return bracket
