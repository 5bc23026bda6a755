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
    total = 0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue                    # gone meanwhile
        if int(fields[2]) == pgid:      # after the name: state, ppid, pgrp, ..., utime (11), stime (12)
            total += int(fields[11]) + int(fields[12])
    return total


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
