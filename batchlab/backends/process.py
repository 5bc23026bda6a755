"""Servers as managed processes: start one, wait until it answers, stop it whatever happens.

A server starts in a process group of its own (its workers with it), and a state file records its
pid, URL and log while it runs; stopping signals the whole group, SIGTERM and then SIGKILL after a
grace period. A server whose starter died (killed, crashed) outlives it: its state file still
names it, so `orphans()` finds it and `stop()` ends it. `managed()` is the whole lifecycle in one
`with` block, for a benchmark now and for baselines started inside a sweep.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import httpx

from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError

SERVER_CPUS, CLIENT_CPU = "1", 0      # split_cores: servers on core 1, the load generator on core 0


@dataclass
class Running:
    server: str              # its name: one state file per name
    pid: int                 # the leader of its process group
    url: str                 # base URL including /v1
    model: str               # the served model name clients send
    log: str
    asked: dict | None = None       # the scheduler limits it was started with (continuous-section names)
    runs_with: dict | None = None   # the limits it says it runs with, once ready (None: it does not say)


def state_dir() -> Path:
    from batchlab.backends.tiny import data_dir
    return data_dir() / "servers"


def state_file(server: str) -> Path:
    return state_dir() / f"{server}.json"


def read(server: str) -> Running | None:
    """The state record of `server` (None: none, or not one batchlab can read)."""
    p = state_file(server)
    try:
        record = json.loads(p.read_text()) if p.is_file() else None
        return Running(**{k: v for k, v in record.items() if k in Running.__dataclass_fields__}) if record else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def note(running: Running) -> None:
    """Rewrite the state record of a running server (e.g. with what it says it runs with)."""
    write_atomic(state_file(running.server), json.dumps(asdict(running)))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                state, _, group = (d / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(group) == pgid and state != "Z":
                out.append(int(d.name))
    return out


def _recycled(pid: int) -> bool:
    """The recorded pid now belongs to another process: alive, but no longer leading its own group."""
    try:
        return alive(pid) and os.getpgid(pid) != pid
    except ProcessLookupError:
        return False


def orphans() -> list[Running]:
    """Servers recorded as running whose process group still has live processes: left by a run
    that died, or in use by another one."""
    found = [read(p.stem) for p in sorted(state_dir().glob("*.json"))] if state_dir().is_dir() else []
    return [r for r in found if r is not None and not _recycled(r.pid) and members(r.pid)]


def start(server: str, cmd: list[str], url: str, model: str, env: dict[str, str] | None = None,
          cpus: str | None = None, asked: dict | None = None) -> tuple[Running, subprocess.Popen]:
    """Start `cmd` in a process group of its own (pinned to `cpus` with taskset), its output to
    <state dir>/<server>.log, and record it."""
    state_dir().mkdir(parents=True, exist_ok=True)
    log = state_dir() / f"{server}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["taskset", "-c", cpus, *cmd] if cpus else cmd, stdout=out, stderr=subprocess.STDOUT,
                                env=os.environ | (env or {}), start_new_session=True)
    running = Running(server, proc.pid, url, model, str(log), asked)
    note(running)
    return running, proc


def wait_ready(running: Running, proc: subprocess.Popen, wait_s: float, path: str = "/health") -> None:
    """Until GET `path` answers 200. A server that exits first, or is not ready in `wait_s`
    seconds (then stopped), is a ConfigError with the tail of its log."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            state_file(running.server).unlink(missing_ok=True)
            raise ConfigError(f"{running.server} exited with status {proc.returncode}; last log lines:\n" + tail(running.log))
        try:
            if httpx.get(running.url.removesuffix("/v1") + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(running.server, echo=lambda _: None)
    raise ConfigError(f"{running.server} did not answer {path} within {wait_s:g} s; last log lines:\n" + tail(running.log))


def stop(server: str, grace_s: float = 30.0, echo: Callable[[str], None] = click.echo) -> Running | None:
    """Stop the named server's whole process group (its workers too, even where its leader has
    already gone): SIGTERM, then SIGKILL after `grace_s`; its state file goes. Returns what was
    recorded (None: nothing was); says so when a process survives."""
    running = read(server)
    if running is None:
        return None
    if not _recycled(running.pid):
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            _signal_group(running.pid, sig)
            deadline = time.monotonic() + wait
            while members(running.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not members(running.pid):
                break
        else:
            echo(f"warning: {server}: processes {members(running.pid)} survived SIGKILL; {running.url} may still be held")
    state_file(server).unlink(missing_ok=True)
    return running


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)          # the group `start` created, led by pid
    except ProcessLookupError:
        pass


@contextmanager
def managed(server: str, cmd: list[str], url: str, model: str, env: dict[str, str] | None = None,
            cpus: str | None = None, wait_s: float = 300.0, echo: Callable[[str], None] = click.echo) -> Iterator[Running]:
    """Start a server, wait until it answers, yield it, and stop it however the block ends. A server
    recorded at the same URL (an orphan of an earlier run: it would hold the port) is stopped first,
    and said so."""
    for old in orphans():
        if old.url == url or old.server == server:
            echo(f"warning: stopping {old.server} (pid {old.pid}), left running at {old.url} by an earlier run")
            stop(old.server, echo=echo)
    running, proc = start(server, cmd, url, model, env, cpus)
    try:
        wait_ready(running, proc, wait_s)
        yield running
    finally:
        stop(server, echo=echo)
        proc.wait()                  # reap it: no zombie left behind


def serve_command(port: int, strategy: str, config: str | None = None, sets: list[str] | tuple[str, ...] = (),
                  model_name: str = "tiny", *extra: str) -> list[str]:
    """The command line of `batchlab serve` on this machine's Python."""
    cmd = [sys.executable, "-m", "batchlab.cli", "serve", *([config] if config else []), "--strategy", strategy,
           "--port", str(port), "--model-name", model_name, *extra]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def split_cores(pin: bool = True) -> str | None:
    """Where there are two cores and taskset: this process (the load generator, and the children it
    starts) moves to core 0 and the cores for servers are returned ("1"); otherwise None (unpinned).
    NOTE: vLLM's engine busy-waits on a core and starves a client that shares it."""
    if not pin or len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None:
        return None
    os.sched_setaffinity(0, {CLIENT_CPU})
    return SERVER_CPUS


def cpu_list(cpus: str) -> list[int]:
    """taskset's list ("1", "0,2", "2-3") as core numbers."""
    out: list[int] = []
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def tail(path: str | Path, n: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
