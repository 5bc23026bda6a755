"""`python -m tests.faults.inject FAULT ARGS...`: batchlab's CLI with one fault installed first.

Faults are installed by replacing one function in the process before the command runs, so the
command itself is the real one. `none` installs nothing.
- `enospc-after-N`: the results writer's appends (run/results.py) write half their text, then
  raise OSError(ENOSPC), from the N+1-th append on: a disk that fills while a point is written.
- `backend-raises`, `backend-hangs`, `backend-exits`: the simulator's step (and batch) raises
  RuntimeError, sleeps for ever, or calls sys.exit(3), from the second call on; with `-in-step`
  (`backend-hangs-in-step`) only its step does, so request-level batches (naive) still run.
- `enospc-writing-NAME`: writing a file named NAME, in place or through the temp file an atomic
  write renames over it, writes half its text, then raises OSError(ENOSPC).
- `killed-writing-NAME`: the process dies (os._exit) halfway through writing a file named NAME
  with Path.write_text: a kill that lands mid-write, made certain.
"""
from __future__ import annotations

import errno
import itertools
import os
import pathlib
import sys
import time


def enospc_after(n: int) -> None:
    from batchlab.run import results

    real, calls = results.append_synced, itertools.count()

    def append_synced(path, text):
        if next(calls) < n:
            return real(path, text)
        real(path, text[: len(text) // 2])           # what fitted before the disk was full
        raise OSError(errno.ENOSPC, "No space left on device")
    results.append_synced = append_synced


def broken_backend(how: str, methods: tuple[str, ...] = ("step", "run_batch")) -> None:
    from batchlab.backends.simulated import SimulatedBackend

    for name in methods:
        real, calls = getattr(SimulatedBackend, name), itertools.count()

        async def broken(self, *args, _real=real, _calls=calls, **kwargs):
            if next(_calls) >= 1:
                if how == "raises":
                    raise RuntimeError("injected backend fault")
                if how == "exits":
                    sys.exit(3)
                while True:                        # hangs, holding the thread (no await: nothing can cancel it)
                    time.sleep(3600)
            return await _real(self, *args, **kwargs)
        setattr(SimulatedBackend, name, broken)


def half_then(names: set[str], then) -> None:
    """Path.open for writing a file named in `names` gives a file that writes half of the first text
    it is given, then calls then(): a process that dies, or a disk that fills, mid-write."""
    real_open = pathlib.Path.open

    def open_(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        if self.name not in names or "w" not in mode:
            return f
        class Half:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()
                return False

            def write(self, data):
                f.write(data[: len(data) // 2])
                f.flush()
                then()

            def __getattr__(self, attr):
                return getattr(f, attr)
        return Half()
    pathlib.Path.open = open_


def killed_writing(name: str) -> None:
    """Dies halfway through writing NAME: in place (Path.write_text) or into the temp file an
    atomic write renames over it (core/files.py writes `.NAME.tmp`)."""
    real_write = pathlib.Path.write_text

    def write_text(self, data, *args, **kwargs):
        if self.name != name:
            return real_write(self, data, *args, **kwargs)
        with open(self, "w") as f:
            f.write(data[: len(data) // 2])
        os._exit(137)                               # as SIGKILL would: no cleanup, no message
    pathlib.Path.write_text = write_text
    half_then({f".{name}.tmp"}, lambda: os._exit(137))


def enospc_writing(name: str) -> None:
    def full():
        raise OSError(errno.ENOSPC, "No space left on device")
    half_then({name, f".{name}.tmp"}, full)


def install(fault: str) -> None:
    if fault.startswith("enospc-after-"):
        enospc_after(int(fault.rsplit("-", 1)[1]))
    elif fault.startswith("backend-") and fault.endswith("-in-step"):
        broken_backend(fault.removeprefix("backend-").removesuffix("-in-step"), methods=("step",))
    elif fault.startswith("backend-"):
        broken_backend(fault.removeprefix("backend-"))
    elif fault.startswith("enospc-writing-"):
        enospc_writing(fault.removeprefix("enospc-writing-"))
    elif fault.startswith("killed-writing-"):
        killed_writing(fault.removeprefix("killed-writing-"))
    elif fault != "none":
        raise SystemExit(f"unknown fault {fault!r}")


if __name__ == "__main__":
    install(sys.argv[1])
    from batchlab.cli import main

    main(sys.argv[2:], prog_name="batchlab")
