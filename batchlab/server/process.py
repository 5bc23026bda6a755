"""`batchlab serve` as a process: its listening socket, and how it shuts down.

The socket is bound before the banner, so a port in use (or a host that does not resolve) is one
error line, not a banner and a server that never listens. uvicorn then serves on that socket
with batchlab's shutdown: the first SIGINT/SIGTERM stops accepting connections and gives the
requests in flight until shortly before `--shutdown-timeout` to finish; what is still running
then fails (a stream ends with an error event, a whole answer is a 503) and the process exits
within the timeout, which a watchdog enforces should anything hang. A second signal exits at once.
"""
from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
import time

import uvicorn

from batchlab.errors import ConfigError
from batchlab.server.service import Server

FLUSH_S = 1.0        # the end of the timeout kept for failing what still runs, flushing its error events and exiting


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: any free one), or ConfigError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # NOTE: as uvicorn does; a listening port still refuses
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        in_use = getattr(e, "errno", None) == errno.EADDRINUSE
        reason = "the port is already in use" if in_use else getattr(e, "strerror", None) or e
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


class GracefulServer(uvicorn.Server):
    """uvicorn's server with a bounded, explicit shutdown (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, service: Server, timeout_s: float):
        super().__init__(config)
        self.service, self.timeout_s = service, timeout_s
        self.signalled_at: float | None = None      # time.monotonic() of the first signal

    def handle_exit(self, sig: int, frame) -> None:
        if self.signalled_at is not None:
            _exit_now(sig, "second signal: exiting now")
        self.signalled_at = time.monotonic()
        _say(f"shutting down; requests in flight have {self._grace_s():g} s to finish (a second signal exits at once)")
        watchdog = threading.Timer(self.timeout_s, _exit_now,
                                   (sig, f"still running {self.timeout_s:g} s after the signal (--shutdown-timeout): exiting"))
        watchdog.daemon = True
        watchdog.start()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown (stop accepting, wait for connections, lifespan), with the drain
        running alongside: it ends the streams, so the connections close."""
        started = self.signalled_at if self.signalled_at is not None else time.monotonic()
        left = self._grace_s() - (time.monotonic() - started)
        drain = asyncio.create_task(self.service.drain(self.service.clock.now() + max(0.0, left)))
        try:
            await super().shutdown(sockets)
        finally:
            drain.cancel()

    def _grace_s(self) -> float:
        """Seconds after the signal that requests in flight may take: the timeout less the flush."""
        return self.timeout_s - min(FLUSH_S, self.timeout_s / 2)


def _exit_now(sig: int, why: str) -> None:
    # NOTE: os._exit, not sys.exit: a forward pass in a worker thread or a stuck connection must
    # not hold the process past its promise; nothing is left to save (the server writes no files).
    _say(why)
    os._exit(128 + sig)


def _say(line: str) -> None:
    # NOTE: os.write, not print: called from a signal handler, which may interrupt a print.
    os.write(2, f"batchlab serve: {line}\n".encode())
