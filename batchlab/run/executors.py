"""Where work runs: one call after another in this process (`local`), or as Ray tasks (`ray`).

A unit of work is an importable function called with picklable arguments; `map` yields each
result as it finishes (local: in order; Ray: in completion order), tagged with its index, and
the caller (the process that started the sweep) writes every result itself, so the results
directory keeps one writer. Ray's own features do the rest: `max_retries` reruns a task whose
worker process died, and resource requests (`Need`: CPUs, a GPU, a custom resource per server)
keep two tasks off one device. Ray is imported only when `kind: ray` is asked for.
"""
from __future__ import annotations

import logging
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from batchlab.core.config import ExecutorConfig
from batchlab.errors import ConfigError

RAY_MISSING = "executor 'ray' needs Ray: pip install 'batchlab[ray]'"
# NOTE: twice the 5 s Ray itself gives a connection to its head (gcs_rpc_server_connect_timeout_s)
# before it warns: room for a head node under load or across a WAN, while a wrong address costs
# 10 s instead of the minutes ray.init spends retrying it.
RAY_CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Need:
    """What one task holds while it runs (a Ray resource request)."""
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()    # custom Ray resources, e.g. (("server:host:8000", 1.0),)

    def text(self) -> str:
        parts = [f"{self.num_gpus:g} GPU"] if self.num_gpus else []
        parts.append(f"{self.num_cpus:g} CPU" + ("s" if self.num_cpus != 1 else ""))
        parts += [f"{v:g} {k}" for k, v in self.resources]
        return " + ".join(parts)


@dataclass(frozen=True)
class Finished:
    """One call's outcome: its index in `map`'s list, its value, and where it ran; or, when its
    worker died more often than the retries allow, `error` (the value is then None)."""
    index: int
    value: Any = None
    node: str = ""
    error: str | None = None


class Executor(ABC):
    """Runs calls of one function and hands their results back to this process as they finish."""
    kind: ClassVar[str]

    @abstractmethod
    def map(self, fn: Callable[..., Any], calls: list[tuple], need: Need = Need()) -> Iterator[Finished]:
        """Call fn(*args) for each args in `calls`; yield a Finished per call as it completes.
        An exception raised by fn itself propagates (it is a bug or a user error, not a lost worker)."""

    @property
    def parallelism(self) -> int:
        """How many one-CPU calls can run at once (how many probes a search round may send)."""
        return 1

    def where(self) -> str:
        """Where calls run, for the placement line of setup.json and the report."""
        return "local (one point after another in the batchlab process)"

    def close(self) -> None:
        """Release what the executor started (a local Ray)."""


class LocalExecutor(Executor):
    kind = "local"

    def map(self, fn, calls, need=Need()):
        host = socket.gethostname()
        for i, args in enumerate(calls):
            yield Finished(i, fn(*args), host)


class RayExecutor(Executor):
    """Ray tasks, on a cluster (`address`, or $RAY_ADDRESS) or on a Ray started here.
    `resources`: custom resources a Ray started here declares (one per server, see server_resource)."""
    kind = "ray"

    def __init__(self, cfg: ExecutorConfig, resources: dict[str, float] | None = None):
        self.ray = import_ray()
        self.max_retries = cfg.max_retries
        self.address = cfg.address or os.environ.get("RAY_ADDRESS")
        self.source = "executor.address" if cfg.address else "$RAY_ADDRESS"
        self.started = False            # True: this object started or joined Ray, and shuts it down
        if not self.ray.is_initialized():
            self._connect(resources or {}, cfg.num_cpus)
        self._check_resources(resources or {})

    def _connect(self, resources: dict[str, float], num_cpus: int | None) -> None:
        address = self.address
        kwargs: dict[str, Any] = {"address": address, "include_dashboard": False, "log_to_driver": False,
                                  "logging_level": logging.WARNING, "configure_logging": True}
        if address in (None, "local"):   # NOTE: CPUs and custom resources can only be declared by a Ray that starts here
            kwargs |= {"num_cpus": num_cpus, "resources": resources or None}
        else:
            check_ray_address(address, self.source)
        try:
            self.ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ConfigError(f"{self.source} {address}: cannot connect to a Ray cluster there "
                              f"({' '.join(str(e).split())[:200]})") from None
        self.started = True

    def _check_resources(self, resources: dict[str, float]) -> None:
        have = self.ray.cluster_resources()
        missing = [k for k in resources if have.get(k, 0) < 1]
        if missing:
            spec = ", ".join(f'"{k}": 1' for k in missing)
            where = f" at {self.address}" if self.address else ""
            raise ConfigError(f"the Ray cluster{where} has no resource {', '.join(missing)}: points against one server run "
                              f"one at a time through it; start one node with --resources '{{{spec}}}'")

    @property
    def parallelism(self) -> int:
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def gpus(self) -> float:
        return float(self.ray.cluster_resources().get("GPU", 0))

    def node_cpus(self) -> int:
        """CPUs of the largest node: what a point asks for when it uses every core of one."""
        return max((int(n["Resources"].get("CPU", 0)) for n in self.ray.nodes() if n.get("Alive")), default=1) or 1

    def where(self) -> str:
        """Where the tasks run; read once while connected (it is also asked after close())."""
        if getattr(self, "_where", None) is None:
            self._where = self._describe()
        return self._where

    def _describe(self) -> str:
        cpus = self.parallelism
        retries = f"a task whose worker dies is retried up to {self.max_retries} time(s)"
        nodes = sum(1 for n in self.ray.nodes() if n.get("Alive"))
        if not self.started:
            return f"ray (the Ray this process had joined, {cpus} CPUs in {nodes} node(s); {retries})"
        if self.address in (None, "local"):
            return f"ray (a local Ray started by batchlab, {cpus} CPUs; {retries})"
        return f"ray (cluster at {self.address}, {cpus} CPUs in {nodes} node(s); {retries})"

    def map(self, fn, calls, need=Need()):
        ray = self.ray
        remote = ray.remote(_on_worker).options(
            num_cpus=need.num_cpus, num_gpus=need.num_gpus, resources=dict(need.resources) or None,
            max_retries=self.max_retries, retry_exceptions=False)   # NOTE: a lost worker is retried, a raised error is not
        index = {remote.remote(fn, *args): i for i, args in enumerate(calls)}
        pending = list(index)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield self._outcome(index[done[0]], done[0])
        finally:
            for ref in pending:          # interrupted (Ctrl-C, an error): stop what has not finished
                ray.cancel(ref, force=True)

    def _outcome(self, i: int, ref) -> Finished:
        exc = self.ray.exceptions
        try:
            value, node = self.ray.get(ref)
        except exc.RayTaskError as e:    # fn raised: the same exception as in a local run
            cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else None
            if cause is not None:
                raise cause from None
            raise
        except (exc.WorkerCrashedError, exc.NodeDiedError, exc.OutOfMemoryError, exc.ActorDiedError,
                exc.TaskUnschedulableError, exc.ObjectLostError) as e:
            why = " ".join(str(e).split())[:160]
            return Finished(i, error=f"its Ray worker died {self.max_retries + 1} time(s), retries exhausted "
                                     f"(executor.max_retries {self.max_retries}): {why}")
        return Finished(i, value, node)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def _on_worker(fn: Callable[..., Any], *args: Any) -> tuple[Any, str]:
    return fn(*args), socket.gethostname()


def check_ray_address(address: str, source: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse, within `timeout_s`, an address where no Ray cluster answers: nothing listening (refused
    at once), a host that cannot be reached, or a port that takes the connection and does not speak
    gRPC, as a Ray head and Ray Client do (the dashboard's HTTP port, a silent port). NOTE: ray.init
    itself retries such an address for minutes (20 attempts, each waiting out several internal
    timeouts), printing only reconnect lines."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return                                   # not host:port ("auto", a typo): ray.init says what is wrong
    where = f"{source} {address}"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            # NOTE: with TLS (RAY_USE_TLS) the handshake comes first; only the connection is checked then
            if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true") and not _speaks_http2(sock):
                raise ConfigError(f"{where}: no Ray cluster there (the port is open, but what answers does not "
                                  "speak Ray's protocol, gRPC; the dashboard's port is not the cluster's address)")
    except TimeoutError:
        raise ConfigError(f"{where}: no Ray cluster answered there within {timeout_s:g} s") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot connect to a Ray cluster there ({(e.strerror or str(e)).lower()})") from None


# RFC 9113 3.4: a client's connection preface, then its SETTINGS frame (empty)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _speaks_http2(sock: socket.socket) -> bool:
    """Whether the server on `sock` answers HTTP/2's preface with its own SETTINGS frame, as every
    gRPC server does first (a 9-byte frame header of type 4); raises TimeoutError if it says nothing."""
    sock.sendall(HTTP2_PREFACE)
    head = b""
    while len(head) < 9:
        chunk = sock.recv(9 - len(head))
        if not chunk:
            return False
        head += chunk
    return head[3] == 4


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def make_executor(cfg: ExecutorConfig, resources: dict[str, float] | None = None) -> Executor:
    """The executor a config asks for; connecting to (or starting) Ray happens here, so a bad
    address or a missing Ray is a ConfigError before anything is written."""
    return RayExecutor(cfg, resources) if cfg.kind == "ray" else LocalExecutor()


def server_resource(base_url: str) -> str:
    """The custom resource that serialises points against one server: `server:HOST:PORT`."""
    from urllib.parse import urlsplit
    u = urlsplit(base_url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return f"server:{u.hostname}:{port}"
