"""Waking an event loop at a planned instant to within tens of microseconds, without spinning.

asyncio's timers wait in epoll, whose timeout is whole milliseconds rounded up: a send planned
at t leaves up to a millisecond late. Spinning the last stretch (yielding until due) is on time
but burns the core the load generator needs, and at a few hundred requests per second the spin
is most of the client's CPU. A Linux timerfd armed at an absolute CLOCK_MONOTONIC instant (the
clock `time.perf_counter` reads on Linux) and registered as a reader of the loop wakes epoll at
that instant (the thread's timer slack is set to 1 us; its default is 50 us), and costs one read per wake. The planned
instants wait in a heap; the fd is always armed at the earliest.

Elsewhere (not Linux, perf_counter not CLOCK_MONOTONIC, no timerfd in libc) `Wakeup.create`
returns None and callers fall back to a timer for most of the way and yielding for the rest.
NOTE: ctypes, not os.timerfd_create: that arrived in Python 3.13.
"""
from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import os
import sys
import time

CLOCK_MONOTONIC = 1
TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 0o4000, 0o2000000, 1
PR_SET_TIMERSLACK = 29
EARLY_S = 20e-6           # a wake this close before an instant serves it (the kernel's own slack is larger)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc():
    """libc through ctypes where a timerfd can serve perf_counter's instants, else None.
    NOTE: CDLL(None), the symbols already loaded, not ctypes.util.find_library: that runs
    ldconfig in a subprocess, on every import."""
    if not sys.platform.startswith("linux") or time.get_clock_info("perf_counter").implementation != \
            "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create, libc.timerfd_settime, libc.prctl  # noqa: B018 (present?)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class Wakeup:
    """Futures resolved at planned `time.perf_counter` instants, through one timerfd on one loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int):
        self.loop, self.fd = loop, fd
        self.heap: list[tuple[float, int, asyncio.Future]] = []
        self.order = itertools.count()
        self.armed = float("inf")
        loop.add_reader(fd, self._fire)

    @classmethod
    def create(cls, loop: asyncio.AbstractEventLoop) -> Wakeup | None:
        if _LIBC is None:
            return None
        fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            return None
        # the kernel may defer a timer by this thread's slack (50 us by default) to batch wake-ups;
        # 1 us keeps a planned send on time at the cost of a few more wake-ups
        _LIBC.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
        try:
            return cls(loop, fd)
        except (NotImplementedError, RuntimeError, ValueError):    # a loop that takes no readers
            os.close(fd)
            return None

    async def until(self, t: float) -> None:
        if t - time.perf_counter() <= EARLY_S:
            return
        fut = self.loop.create_future()
        heapq.heappush(self.heap, (t, next(self.order), fut))
        if t < self.armed:
            self._arm(t)
        await fut

    def _arm(self, t: float) -> None:
        sec = int(t)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, max(1, int((t - sec) * 1e9))))
        if _LIBC.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.armed = t

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass
        now = time.perf_counter() + EARLY_S
        while self.heap and self.heap[0][0] <= now:
            _, _, fut = heapq.heappop(self.heap)
            if not fut.done():
                fut.set_result(None)
        self.armed = float("inf")
        if self.heap:
            self._arm(self.heap[0][0])

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.fd)
        except (RuntimeError, ValueError):    # the loop is already closed
            pass
        os.close(self.fd)
        for _, _, fut in self.heap:
            fut.cancel()
        self.heap = []
