"""Waking the loop at planned instants (core/timer.py) and RealClock.sleep_until on top of it.
What is checked is order and never-early, not precision: precision is a benchmark's business
(benchmarks/loadgen.py records the send lag it gives)."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from batchlab.core import timer
from batchlab.core.clock import RealClock
from batchlab.core.timer import EARLY_S, Wakeup

linux_timerfd = pytest.mark.skipif(timer._LIBC is None, reason="no timerfd on this machine")


@linux_timerfd
def test_waiters_wake_in_the_order_of_their_instants_and_never_before_them():
    woke: list[tuple[int, float, float]] = []

    async def main():
        w = Wakeup.create(asyncio.get_running_loop())
        assert w is not None
        base = time.perf_counter() + 0.02
        plan = [0.012, 0.003, 0.009, 0.0, 0.006]              # given out of order, one already due soon

        async def one(k, t):
            await w.until(t)
            woke.append((k, t, time.perf_counter()))
        await asyncio.gather(*(one(k, base + d) for k, d in enumerate(plan)))
        w.close()
    asyncio.run(main())
    assert [k for k, _, _ in woke] == [3, 1, 4, 2, 0]
    assert all(at >= t - EARLY_S for _, t, at in woke)


@linux_timerfd
def test_a_cancelled_waiter_does_not_stop_the_others():
    async def main():
        w = Wakeup.create(asyncio.get_running_loop())
        t = time.perf_counter()
        gone = asyncio.create_task(w.until(t + 0.005))
        await asyncio.sleep(0)
        gone.cancel()
        await w.until(t + 0.01)
        assert time.perf_counter() >= t + 0.01 - EARLY_S and gone.cancelled()
        w.close()
    asyncio.run(main())


def open_timerfds() -> int:
    """This process's open timerfds (other threads' sockets and pipes come and go: not counted)."""
    n = 0
    for fd in os.listdir(f"/proc/{os.getpid()}/fd"):
        try:
            n += os.readlink(f"/proc/{os.getpid()}/fd/{fd}") == "anon_inode:[timerfd]"
        except OSError:
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc")
def test_real_clock_sleeps_to_its_instant_over_several_runs_and_closes_what_it_opened():
    clock = RealClock()

    async def main():
        t = clock.now() + 0.01
        await clock.sleep_until(t)
        return clock.now() - t
    before = open_timerfds()
    late = [clock.run(main()) for _ in range(3)]
    assert all(x >= -EARLY_S for x in late)
    assert open_timerfds() == before


def test_without_a_timerfd_the_clock_yields_until_due(monkeypatch):
    monkeypatch.setattr(Wakeup, "create", classmethod(lambda cls, loop: None))
    clock = RealClock()

    async def main():
        t = clock.now() + 0.004
        await clock.sleep_until(t)
        return clock.now() - t
    assert clock.run(main()) >= 0
