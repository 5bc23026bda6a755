"""One clock abstraction: everything reads time through `Clock.now()` and waits through it.

`RealClock` is `time.perf_counter` plus asyncio sleeps. `VirtualClock` runs an asyncio event loop
whose time jumps to the next timer whenever nothing is ready, so an hour of simulated traffic
takes seconds and is bit-for-bit reproducible. asyncio keeps ready callbacks FIFO and timers in
a heap, so equal-time events come out in the same order on every run.

NOTE: `VirtualClock.sleep` has a fast path: when nothing else is ready and no other timer falls
due before the wake-up, it advances time without a trip through the loop. A lone simulation
driver then costs almost nothing per step; with several coroutines (replicas, a server) it
falls back to ordinary asyncio scheduling, so the order of events is the same either way.
"""
from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from batchlab.core.timer import Wakeup

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...
    async def sleep_until(self, t: float) -> None:
        """Sleep until the clock reads `t` exactly (no drift from now + (t - now))."""
    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        """Wait until `event` is set or `timeout` seconds pass; True if the event was set."""
    def run(self, main: Awaitable[T]) -> T:
        """Run `main` to completion on an event loop driven by this clock."""


async def _wait(event: asyncio.Event, timeout: float | None) -> bool:
    """asyncio's own wait: the loop's time (real or virtual) decides when the timeout fires."""
    if event.is_set():
        return True
    if timeout is not None and timeout <= 0:
        return False
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except TimeoutError:
        return False


class RealClock:
    """Wall-clock time: monotonic, high resolution. `sleep_until` wakes at its instant to tens of
    microseconds where the machine has a timerfd (core/timer.py), else within a millisecond by
    yielding the last stretch (asyncio's timers are whole milliseconds)."""

    SPIN_S = 0.0015          # without a timerfd: the last stretch before an instant is waited by yielding

    def __init__(self) -> None:
        self._wakeup: Wakeup | None = None
        self._wakeup_loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, t: float) -> None:
        loop = asyncio.get_running_loop()
        if self._wakeup_loop is not loop:
            self._close_wakeup()
            self._wakeup, self._wakeup_loop = Wakeup.create(loop), loop
        if self._wakeup is not None:
            return await self._wakeup.until(t)
        if t - self.now() > self.SPIN_S:
            await asyncio.sleep(t - self.now() - self.SPIN_S)
        while self.now() < t:
            await asyncio.sleep(0)

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        return await _wait(event, timeout)

    def run(self, main: Awaitable[T]) -> T:
        """Run `main` on uvloop where it is installed (the `serve` extra), else on asyncio's loop.
        NOTE: uvloop's I/O callbacks cost a third less than asyncio's own; a load generator
        handles one per streamed token, and the time they take delays the next planned send."""
        async def whole():
            try:
                return await main
            finally:
                self._close_wakeup()
        try:
            import uvloop
        except ImportError:
            return asyncio.run(whole())
        return uvloop.run(whole())

    def _close_wakeup(self) -> None:
        if self._wakeup is not None:
            self._wakeup.close()
        self._wakeup = self._wakeup_loop = None


class _JumpingSelector(selectors.BaseSelector):
    """A selector with no I/O: 'waiting' for `timeout` means moving virtual time to the next timer."""

    def __init__(self, clock: "VirtualClock"):
        self._clock = clock
        self._map: dict = {}

    def register(self, fileobj, events, data=None):
        key = selectors.SelectorKey(fileobj, 0, events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj):
        return self._map.pop(fileobj)

    def select(self, timeout=None):
        if timeout is None:
            raise RuntimeError("virtual clock deadlock: nothing is ready and no timer is set")
        loop = self._clock._loop
        if timeout > 0 and loop is not None and loop._scheduled:
            # Land exactly on the next timer rather than accumulating float error.
            self._clock._t = max(self._clock._t, loop._scheduled[0].when())
        return []

    def close(self):
        self._map.clear()

    def get_map(self):
        return self._map


class VirtualClock:
    """Simulated time, starting at `start` seconds. Only usable inside `run()`."""

    def __init__(self, start: float = 0.0):
        self._t = float(start)
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        return self._t

    async def sleep(self, seconds: float) -> None:
        target = self._t + max(0.0, seconds)
        loop = self._loop
        if not loop._ready and (not loop._scheduled or loop._scheduled[0].when() > target):
            self._t = target            # nobody else could run before then: jump
            return
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, t: float) -> None:
        loop = self._loop
        if t <= self._t:
            return
        if not loop._ready and (not loop._scheduled or loop._scheduled[0].when() > t):
            self._t = t
            return
        fut = loop.create_future()
        loop.call_at(t, fut.set_result, None)
        await fut

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        return await _wait(event, timeout)

    def run(self, main: Awaitable[T]) -> T:
        loop = asyncio.SelectorEventLoop(_JumpingSelector(self))
        loop.time = self.now  # asyncio reads timers against this
        loop._clock_resolution = 1e-12
        self._loop = loop
        try:
            return loop.run_until_complete(main)
        finally:
            self._loop = None
            loop.close()
