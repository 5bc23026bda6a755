"""LoadTarget's send loop: fail fast when the first requests all fail the same way.

A fake server backend on the RealClock (a server run is real time by nature: the send loop
yields until each planned arrival), no sockets. Its `send` takes `latency_s` and fails or
finishes each request as the test says; both server kinds (openai, hf-cb) share this loop, so
the rule is tested once here (and against httpx in test_openai.py). Nothing asserts on timing:
the trace spans seconds so that the first answers come back long before its end."""
from __future__ import annotations

import contextlib

from batchlab.backends.base import FAIL_FAST_AFTER, LoadTarget, common_failure
from batchlab.core.breakdown import finish
from batchlab.core.clock import RealClock
from batchlab.core.request import Request, Status
from batchlab.core.traffic import TraceItem


class FakeServer(LoadTarget):
    def __init__(self, outcome, latency_s: float = 0.01):
        super().__init__()
        self.outcome, self.latency_s = outcome, latency_s    # outcome(request) -> error text or None
        self.sent: list[int] = []

    @contextlib.asynccontextmanager
    async def session(self, concurrency: int):
        yield None

    async def send(self, r: Request, session, clock) -> None:
        self.sent.append(r.index)
        await clock.sleep(self.latency_s)
        error = self.outcome(r)
        if error:
            r.fail(error)
            return
        for _ in range(r.max_new_tokens):
            r.stamp_token(clock.now())
        finish(r)


def run(backend: LoadTarget, n: int = 100, gap_s: float = 0.02) -> list[Request]:
    clock = RealClock()
    trace = [TraceItem(i * gap_s, 4, 2) for i in range(n)]
    requests, _ = clock.run(backend.run_trace(trace, clock))
    assert len(requests) == n               # nothing is ever dropped
    return requests


def test_the_first_requests_all_failing_alike_stop_the_point_and_keep_every_failure():
    # 0.3 s per answer, a request every 0.02 s: when the 20th answer is in, about 15 more are in flight.
    b = FakeServer(lambda r: f"HTTP 404: model 'x' not found (request {r.index})", latency_s=0.3)
    requests = run(b)
    first = requests[:FAIL_FAST_AFTER]
    assert all(r.error.startswith("HTTP 404: model 'x' not found (request") for r in first)   # kept as recorded
    assert [r.error for r in first] == [f"HTTP 404: model 'x' not found (request {i})" for i in range(FAIL_FAST_AFTER)]
    unsent = [r for r in requests if r.error.startswith("not sent: ")]
    assert unsent and len(b.sent) + len(unsent) == len(requests) and len(b.sent) < len(requests)
    assert unsent[0].error == (f"not sent: the first {FAIL_FAST_AFTER} requests all failed with: "
                               "HTTP 404: model 'x' not found (request 0)")
    assert all(r.status is Status.FAILED for r in requests)
    # In flight when the point stopped (sent after the first 20, not yet answered): cancelled, said so.
    cancelled = [r.index for r in requests if r.error.startswith("cancelled in flight: ")]
    assert cancelled and set(cancelled) <= set(b.sent) and min(cancelled) >= FAIL_FAST_AFTER


def test_different_errors_or_a_success_among_the_first_keep_sending():
    alternating = FakeServer(lambda r: "timeout" if r.index % 2 else "HTTP 500: boom")
    requests = run(alternating, n=40, gap_s=0.01)
    assert len(alternating.sent) == 40 and all(r.error in ("timeout", "HTTP 500: boom") for r in requests)
    one_ok = FakeServer(lambda r: None if r.index == 7 else "HTTP 500: boom")
    requests = run(one_ok, n=40, gap_s=0.01)
    assert len(one_ok.sent) == 40 and requests[7].status is Status.FINISHED


def test_a_short_trace_is_always_sent_whole():
    b = FakeServer(lambda r: "HTTP 500: boom")
    run(b, n=FAIL_FAST_AFTER)
    assert len(b.sent) == FAIL_FAST_AFTER


def test_a_recovered_server_is_not_stopped_by_its_first_failures():
    # The first 20 time out slowly while later requests succeed: no abort once one succeeded.
    slow_first = FakeServer(lambda r: "timeout after 1 s" if r.index < FAIL_FAST_AFTER else None)

    async def send(r, session, clock, inner=slow_first.send):
        if r.index < FAIL_FAST_AFTER:
            await clock.sleep(0.5)           # answered after requests 20.. already finished
        await inner(r, session, clock)
    slow_first.send = send
    requests = run(slow_first, n=60, gap_s=0.02)
    assert len(slow_first.sent) == 60
    assert sum(r.status is Status.FINISHED for r in requests) == 60 - FAIL_FAST_AFTER


def test_common_failure_ignores_numbers_only():
    def failed(err):
        r = Request("x", 1, 1, 0.0)
        r.fail(err)
        return r
    assert common_failure([failed("HTTP 404 after 3 s"), failed("HTTP 404 after 12 s")], []) == "HTTP 404 after 3 s"
    assert common_failure([failed("HTTP 404"), failed("HTTP 422")], []) == "HTTP 404"
    assert common_failure([failed("HTTP 404"), failed("connection refused")], []) is None
