"""`batchlab serve` as a process: its listening socket, its banner, and how it shuts down.

The socket is bound before anything starts, so a port in use (or a host that does not resolve) is
one error line; the banner comes once uvicorn accepts connections, so a script that reads it can
connect at once. The first SIGINT/SIGTERM drains, as vLLM's --shutdown-timeout does: from that
instant every request the server reads gets 503 (Connection: close) and /health 503, while the
requests in flight have until shortly before `--shutdown-timeout` to finish; what still runs then
fails (a stream ends with an error event). Then uvicorn's own shutdown closes the listening socket
and the idle connections, and the process exits within the timeout, which a watchdog enforces
should anything hang. A second signal exits at once. Nothing here may fail on a closed stderr.
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
    """uvicorn's server with a banner once it accepts and a bounded, explicit shutdown (see the
    module docstring)."""

    def __init__(self, config: uvicorn.Config, service: Server, timeout_s: float, banner: str = ""):
        super().__init__(config)
        self.service, self.timeout_s, self.banner = service, timeout_s, banner
        self.signalled_at: float | None = None      # time.monotonic() of the first signal
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Future | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and self.banner:             # create_server has run: connections are accepted
            say(self.banner)

    def handle_exit(self, sig: int, frame) -> None:
        if self.signalled_at is not None:
            _exit_now(sig, "second signal: exiting now")
        self.signalled_at = time.monotonic()
        self.service.draining = True                # NOTE: at once; uvicorn itself looks only every 0.1 s
        watchdog = threading.Timer(self.timeout_s, _exit_now,
                                   (sig, f"still running {self.timeout_s:g} s after the signal (--shutdown-timeout): exiting"))
        watchdog.daemon = True
        watchdog.start()
        say(f"shutting down; requests in flight have {self._grace_s():g} s to finish (a second signal exits at once)")
        if self.started and self._loop is not None:
            # NOTE: call_soon_threadsafe is safe in a signal handler; the drain runs on the loop
            self._loop.call_soon_threadsafe(self._start_drain, sig, frame)
        else:                                       # still starting: uvicorn shuts down once started
            super().handle_exit(sig, frame)

    def _start_drain(self, sig: int, frame) -> None:
        async def drain_then_stop():
            try:
                await self.service.drain(self._deadline())
            finally:                                # uvicorn's shutdown: stop listening, close idle connections
                uvicorn.Server.handle_exit(self, sig, frame)
        self._drain = asyncio.ensure_future(drain_then_stop())

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown (stop accepting, wait for connections, lifespan), with the drain
        running alongside when no signal started one: it ends the streams, so the connections close."""
        drain = asyncio.ensure_future(self.service.drain(self._deadline()))
        try:
            await super().shutdown(sockets)
        finally:
            drain.cancel()

    def _deadline(self) -> float:
        """The service clock's reading by which requests in flight must have finished."""
        started = self.signalled_at if self.signalled_at is not None else time.monotonic()
        left = self._grace_s() - (time.monotonic() - started)
        return self.service.clock.now() + max(0.0, left)

    def _grace_s(self) -> float:
        """Seconds after the signal that requests in flight may take: the timeout less the flush."""
        return self.timeout_s - flush_s(self.timeout_s)


def flush_s(timeout_s: float) -> float:
    return min(FLUSH_S, timeout_s / 2)


def _exit_now(sig: int, why: str) -> None:
    # NOTE: os._exit, not sys.exit: a forward pass in a worker thread or a stuck connection must
    # not hold the process past its promise; nothing is left to save (the server writes no files).
    say(why)
    os._exit(128 + sig)


def say(line: str) -> None:
    """One line on stderr, from anywhere, a signal handler included.
    NOTE: os.write, not print: a signal may interrupt a print. Errors are dropped: with stderr a
    closed pipe (`batchlab serve 2>&1 | head -n1`) the line has no reader, and raising here would
    stop the shutdown it announces."""
    try:
        os.write(2, f"batchlab serve: {line}\n".encode())
    except OSError:
        pass
