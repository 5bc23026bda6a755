"""One thread for all of a process's torch work on the CPU.

PyTorch's CPU wheels parallelise ops with GNU OpenMP, which gives every thread that starts a
parallel region a team of worker threads of its own, kept for as long as that thread lives. While
the teams' threads together outnumber the cores, libgomp runs throttled: a waiting worker spins
100 times instead of 300,000 before it sleeps (libgomp's documented GOMP_SPINCOUNT defaults), so
every op of a pass pays a wake-up. A small model's pass is hundreds of short ops, so this decides
its speed: the tiny model's decode pass ran 1.34x slower at 16 rows and 1.43x at 64 when set up
on one thread and run through `asyncio.to_thread` (whose pool hands successive calls to whichever
of its threads is free) than with every op on one thread (benchmarks/torch_thread_ab.py, a fresh
process per sample, 2 cores).

So loading, the engine's passes and everything that allocates or copies the K/V cache run here,
on one thread: one team, spinning as it should. The thread is per process (a forked or spawned
worker gets its own on first use). A library that runs its passes on a thread of its own
(transformers' continuous batching manager) would run throttled beside our thread's team, so
its backend ends our thread first (`release`); the next call starts a new one.
"""
from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

NAME = "batchlab-torch"

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_pid: int | None = None


def _pool() -> ThreadPoolExecutor:
    """The process's one worker. NOTE: keyed by pid: a forked child inherits the parent's executor
    object but not its thread, and would wait on it for ever."""
    global _executor, _pid
    with _lock:
        if _executor is None or _pid != os.getpid():
            _executor, _pid = ThreadPoolExecutor(max_workers=1, thread_name_prefix=NAME), os.getpid()
        return _executor


def on_it() -> bool:
    """True on the torch thread itself."""
    return threading.current_thread().name.startswith(NAME) and _pid == os.getpid()


async def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on the torch thread, awaited (the event loop stays free)."""
    if on_it():
        return fn(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(fn, *args, **kwargs))


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on the torch thread, waited for (for short work between passes:
    nothing else runs there then)."""
    if on_it():
        return fn(*args, **kwargs)
    return _pool().submit(fn, *args, **kwargs).result()


def release() -> None:
    """End the torch thread and so its OpenMP team (a no-op without one); the next call starts a
    new thread. Not from the thread itself, which cannot wait for its own end."""
    global _executor
    if on_it():
        raise RuntimeError("torch_thread.release() from the torch thread")
    with _lock:
        ex, _executor = (_executor, None) if _pid == os.getpid() else (None, None)
    if ex is not None:
        ex.shutdown(wait=True)
