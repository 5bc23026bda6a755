"""How much of a server's cores other processes took while it ran: contention, measured.

A short reference burst cannot see a job that burns a share of every 100 ms (the burst slips
between its bursts), yet over a minute that job takes its share of the core. So the core time is
counted instead, from the kernel's own books (Linux /proc), over the whole window:

    others' share = (the cores' busy time - the server's own CPU time) / (window x cores)

"Busy" is everything but idle and I/O wait, so time the hypervisor stole counts as taken too. A
server that needs its whole core (at its knee) keeps 1 - share of it, so its steps take
1 / (1 - share) as long: the factor a twin's step costs are scaled by. Below its knee a server
waits part of the time and is slowed less; the factor is an upper bound there.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROC = Path("/proc")


@dataclass(frozen=True)
class Books:
    """One reading: wall clock, the cores' busy seconds, the server's process group's CPU seconds."""
    at: float
    busy_s: float
    server_s: float


def read(cores: list[int], pgid: int, proc: Path = PROC) -> Books | None:
    """The books now; None where there is no /proc (not Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, *ticks = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            counts = [int(x) for x in ticks[:8]]
            busy += sum(counts) - counts[3] - counts[4]          # less idle and I/O wait
    return Books(time.monotonic(), busy / tick, _group_ticks(pgid, proc) / tick)


def _group_ticks(pgid: int, proc: Path) -> int:
    """User + system ticks of every live process in process group `pgid` (a server and its workers)."""
    return sum(f[11] + f[12] for f in _group_stats(pgid, proc))


def _group_stats(pgid: int, proc: Path) -> Iterator[list[int]]:
    """The numeric stat fields after the name of every live process in group `pgid`: state is
    left out as 0; then ppid (1), pgrp (2), ..., minflt (7), ..., utime (11), stime (12)."""
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue                    # gone meanwhile
        if int(fields[2]) == pgid:
            yield [0] + [int(x) for x in fields[1:13]]


@dataclass(frozen=True)
class Usage:
    """What a process group has spent so far: CPU seconds in user and kernel mode, and minor page
    faults (first touches of memory it mapped: a fresh server's allocations show here)."""
    user_s: float
    system_s: float
    minor_faults: int

    def since(self, before: Usage) -> Usage:
        return Usage(self.user_s - before.user_s, self.system_s - before.system_s, self.minor_faults - before.minor_faults)


def usage(pgid: int, proc: Path = PROC) -> Usage | None:
    """Process group `pgid`'s usage now; None where there is no /proc (not Linux)."""
    if not (proc / "stat").is_file():
        return None
    tick, user, system, faults = os.sysconf("SC_CLK_TCK"), 0, 0, 0
    for f in _group_stats(pgid, proc):
        user, system, faults = user + f[11], system + f[12], faults + f[7]
    return Usage(user / tick, system / tick, faults)


def stolen_s(proc: Path = PROC) -> float | None:
    """Seconds the hypervisor has taken from every core so far (/proc/stat's steal); None without /proc."""
    try:
        first = (proc / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    return int(first[8]) / os.sysconf("SC_CLK_TCK") if first[0] == "cpu" and len(first) > 8 else None


def host_speed(repeats: int = 5) -> dict[str, float]:
    """The host's speed now, on this process's core: the median seconds of a fixed piece of
    interpreter work and of a fixed float64 matrix product loop. NOTE: not a server's speed, but
    the same figure taken before every point of a run says whether the machine changed under it."""
    a = np.random.default_rng(0).random((128, 128))

    def interp():
        total = 0
        for i in range(200_000):
            total += i & 7
        return total

    def product():
        for _ in range(100):
            a @ a

    out = {}
    for name, work in (("python_s", interp), ("matmul_s", product)):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            work()
            times.append(time.perf_counter() - t)
        out[name] = sorted(times)[len(times) // 2]
    return out


def others_share(before: Books, after: Books, cores: int) -> float:
    """The share of the cores' time other processes took between two readings (0 to 1)."""
    window = (after.at - before.at) * cores
    if window <= 0:
        return 0.0
    taken = (after.busy_s - before.busy_s) - (after.server_s - before.server_s)
    return min(max(taken / window, 0.0), 0.99)


@contextmanager
def contention(cores: list[int], pgid: int, proc: Path = PROC) -> Iterator[dict]:
    """Measure others' share of `cores` while the block runs; the dict it yields is filled in
    when the block ends ({} where there is no /proc): others_share, factor, window_s, cores."""
    found: dict = {}
    before = read(cores, pgid, proc)
    try:
        yield found
    finally:
        after = read(cores, pgid, proc) if before else None
        if before and after:
            share = others_share(before, after, len(cores))
            found |= {"others_share": share, "factor": 1 / (1 - share), "window_s": after.at - before.at,
                      "cores": list(cores)}
