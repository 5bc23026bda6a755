"""Helpers of the fault-injection suite: batchlab commands as real processes, and faults to inject.

Every command runs as `python -m tests.faults.inject FAULT batchlab-args...`: the fault (or
`none`) is installed in that process, then batchlab's own CLI runs. A run must end within a
generous bound ("ends at all"), and end in at most one line on stderr.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENDS_WITHIN_S = 60.0          # "ends at all": far above any command here (a few seconds), far below a hang


def batchlab(*args: str, fault: str = "none", cwd: Path | None = None, **popen) -> subprocess.Popen:
    """Start `batchlab ARGS` as a process with `fault` installed (tests/faults/inject.py)."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "tests.faults.inject", fault, *args], cwd=cwd or ROOT, env=env,
                            text=True, **popen)


def finish(proc: subprocess.Popen, timeout: float = ENDS_WITHIN_S) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a command that must end within `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"still running after {timeout:g} s: {proc.args}")
    return proc.returncode, out or "", err or ""


def run(*args: str, fault: str = "none", cwd: Path | None = None, timeout: float = ENDS_WITHIN_S) -> tuple[int, str, str]:
    return finish(batchlab(*args, fault=fault, cwd=cwd), timeout)


def one_error_line(err: str, prefix: str = "error: ") -> str:
    """The one line a failed command may print: `prefix...`, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in err, err[-2000:]
    return lines[0]


def last_error_line(err: str) -> str:
    """A command that reports progress on stderr (capacity's rounds) ends in one error line."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and sum(line.startswith("error: ") for line in lines) == 1 and "Traceback" not in err, err[-2000:]
    return one_error_line(lines[-1])


def kill_after(proc: subprocess.Popen, seconds: float, sig: int = signal.SIGKILL) -> None:
    """Send `sig` after `seconds`, unless the command has already ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(sig)


def wait_for_path(path: Path, proc: subprocess.Popen, timeout: float = ENDS_WITHIN_S) -> bool:
    """Whether `path` appeared while `proc` still ran."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            return True
        time.sleep(0.01)
    return False
