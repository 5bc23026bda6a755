"""The serving engine: the ordinary driver loop, fed by HTTP handlers.

`drive()` runs unchanged (run/driver.py) with a live Inbox and the real clock, as a task on the
server's event loop (backends run forward passes in worker threads, so `/health` and 429s keep
answering while the model is busy), or on a thread of its own for a backend that would block
the loop. Handlers stamp a request's arrival, `submit()` it and are woken by
`notify(requests)` whenever tokens were stamped on them or they finished (the driver's
`on_progress` and `on_done`); they read the stamps themselves. After `flush_idle_s` without
arrivals the inbox counts as draining, so a naive batch never strands its last requests.
`abort()` stops the driver mid-step on shutdown: every request it held fails with the reason.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from batchlab.backends.base import Backend
from batchlab.core.clock import Clock, RealClock
from batchlab.core.request import Request
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers.base import Scheduler

Notify = Callable[[list[Request]], None]


class Engine:
    def __init__(self, scheduler: Scheduler, backend: Backend, clock: Clock | None = None,
                 on_batch: Callable[[int], None] = lambda n: None,
                 on_done: Callable[[Request], None] = lambda r: None, flush_idle_s: float | None = 1.0):
        self.scheduler = scheduler
        self.flush_idle_s = flush_idle_s      # no arrivals this long: flush partial batches (None: never)
        self.backend = backend
        self.clock = clock or RealClock()
        self.on_batch = on_batch              # size of every batch or step launched (metrics)
        self.on_done = on_done
        self.notify: Notify = lambda reqs: None
        self.error: BaseException | None = None  # set if the engine loop died
        self.aborted: str | None = None       # why abort() stopped the engine (shutdown)
        self._driver: asyncio.Task | None = None  # the task running drive(), on the engine's loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._inbox: Inbox | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # --- HTTP side ----------------------------------------------------------------------------
    async def start(self, notify: Notify, threaded: bool = False, timeout: float = 600.0) -> None:
        """Load and warm up the backend, then start driving.

        Default: the driver runs as a task on the caller's event loop: no thread hand-offs, which
        cost the engine a GIL switch per step (our backends run forward passes in worker threads,
        so the loop stays free). `threaded=True` gives the driver a thread and loop of its own,
        for a backend that would block the loop."""
        self.notify = notify
        if not threaded:
            self._bind()
            await self.backend.start(self.clock)
            self._task = self._loop.create_task(self._drive())
            return
        self._thread = threading.Thread(target=self._thread_main, name="batchlab-engine", daemon=True)
        self._thread.start()
        if not await asyncio.to_thread(self._ready.wait, timeout):
            raise RuntimeError(f"backend did not start within {timeout:g} s")
        if self.error is not None:
            raise RuntimeError(f"backend failed to start: {self.error}") from self.error

    def submit(self, r: Request) -> None:
        self._call(self._inbox.push, r)

    def cancel(self, r: Request) -> None:
        if not r.is_done:
            self._call(self._inbox.cancel, r)

    def abort(self, reason: str) -> None:
        """Stop driving now, mid-step if need be: every request waiting or running fails with
        `reason` (their handlers are notified). The engine does not start again."""
        if self._inbox is not None:
            self._call(self._abort_now, reason)

    async def stop(self, timeout: float = 10.0) -> None:
        if self._inbox is None:
            return
        self._call(self._inbox.close, None)
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=timeout)
        elif self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout)

    @property
    def alive(self) -> bool:
        running = self._task is not None and not self._task.done() or \
            self._thread is not None and self._thread.is_alive()
        return running and self.error is None

    def running_count(self) -> int:
        return len(self.scheduler.running)

    def queued_count(self) -> int:
        """Requests submitted and not yet scheduled: in the inbox or the scheduler's queue. Read
        on every admission, so it counts two containers rather than walking every live request
        (at a few thousand queued streams the walk cost more than the admission itself)."""
        if self._inbox is None:
            return 0
        return len(self._inbox.live) + len(self.scheduler.waiting)

    def _call(self, fn, arg) -> None:
        args = () if arg is None else (arg,)
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:        # the engine thread's loop has closed (aborted or died): nothing to tell
            if not self._loop.is_closed():
                raise

    # --- engine side --------------------------------------------------------------------------
    def _bind(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._inbox = Inbox(live=True, flush_idle_s=self.flush_idle_s)

    def _thread_main(self) -> None:
        async def main():
            self._bind()
            await self.backend.start(self.clock)
            self._ready.set()
            await self._drive()
        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - recorded, surfaced by /health and on requests
            self.error = e
        finally:
            self._ready.set()

    def _abort_now(self, reason: str) -> None:
        self.aborted = reason
        if self._driver is not None:
            self._driver.cancel()

    async def _drive(self) -> None:
        self._driver = asyncio.current_task()
        if self.aborted is not None:          # aborted before the driver got going
            return await self.backend.close()
        try:
            await drive(self.scheduler, self.backend, self.clock, self._inbox,
                        on_done=self._done, on_progress=self.notify, on_launch=self.on_batch)
        except asyncio.CancelledError:
            if self.aborted is None:
                raise
            self._fail_everything(self.aborted)   # an ordered stop, not an engine error
        except BaseException as e:
            self.error = e
            self._fail_everything(f"engine stopped: {type(e).__name__}: {e}")
            # NOTE: an exception ends this task; a SystemExit (a backend's sys.exit) would escape the
            # event loop and take the HTTP server down with it, unanswered. The server stays up with
            # the engine stopped: requests fail, /health answers 503, a signal stops the process.
            if not isinstance(e, SystemExit):
                raise
        finally:
            await self.backend.close()

    def _done(self, r: Request) -> None:
        self.on_done(r)
        self.notify([r])

    def _fail_everything(self, error: str) -> None:
        stuck = list(dict.fromkeys([*self.scheduler.waiting, *self.scheduler.running, *self._inbox.live]))
        for r in stuck:
            if not r.is_done:
                r.fail(error)
                self.on_done(r)
        self.notify(stuck)
