"""A busy machine, on purpose: other work beside a server, so a check can be run quiet and busy.

One process per core busy-loops for `duty` of every `period_s` and sleeps the rest, pinned to
its core, at normal priority: the contention another job brings (a test suite, a build), at a
level that is set and recorded rather than whatever the machine happens to be doing. The
processes stop when the `with` block ends, however it ends, and on their own within a period
when the process that started them is gone (killed with no chance to end the block).
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from batchlab.errors import ConfigError

BURN = """
import os, sys, time
duty, period, parent = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
while os.getppid() == parent:
    start = time.perf_counter()
    while time.perf_counter() - start < duty * period:
        pass
    time.sleep((1 - duty) * period)
"""


@contextmanager
def background_load(cores: list[int], duty: float, period_s: float = 0.1) -> Iterator[dict]:
    """Burn `duty` of each of `cores` while the block runs; yields what it runs, for the record."""
    if not 0 < duty <= 1 or period_s <= 0:
        raise ConfigError(f"background load: need 0 < duty <= 1 and a positive period (got {duty:g}, {period_s:g})")
    procs = []
    try:
        for core in cores:
            # NOTE: the starter's pid is passed, not read by the burner: it may be gone before the burner's interpreter is up
            p = subprocess.Popen([sys.executable, "-c", BURN, str(duty), str(period_s), str(os.getpid())],
                                 start_new_session=True)
            procs.append(p)
            try:       # NOTE: any core of the machine, not only this process's (a client pins itself to one)
                os.sched_setaffinity(p.pid, {core})
            except OSError:
                raise ConfigError(f"background load: core {core} is not available here") from None
        yield {"cores": list(cores), "duty": duty, "period_s": period_s, "pids": [p.pid for p in procs]}
    finally:
        for p in procs:
            p.kill()
            p.wait()
