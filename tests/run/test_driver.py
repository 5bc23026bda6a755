"""The driver's own count of requests in the system (Occupancy), on the seed's worked example
(arrivals at 0, 1, 5, 6, 7 needing 6, 3, 4, 2, 5 steps of one time unit), and what the
Little's-law check makes of it when the stamps are right, lost or wrong."""
import contextlib

import pytest

from batchlab.backends.base import LoadTarget
from batchlab.core.breakdown import finish
from batchlab.core.clock import VirtualClock
from batchlab.core.metrics import littles_law
from batchlab.core.request import Status
from batchlab.core.traffic import TraceItem
from batchlab.run.config import load_config
from batchlab.run.driver import Inbox, Occupancy, drive
from batchlab.run.point import run_point
from batchlab.run.replicas import make_replicas, serve_replicated
from batchlab.run.router import LeastOutstanding
from batchlab.schedulers import ContinuousConfig, ContinuousScheduler, NaiveConfig, NaiveScheduler
from tests.fakes import UnitStepBackend, make_requests

ARRIVALS = [0, 1, 5, 6, 7]
OUTPUTS = [6, 3, 4, 2, 5]


def run(scheduler, backend=None):
    reqs = make_requests(ARRIVALS, OUTPUTS)
    occ, clock = Occupancy(), VirtualClock()
    clock.run(drive(scheduler, backend or UnitStepBackend(), clock, Inbox(reqs), occupancy=occ))
    return reqs, occ.changes


def naive():
    return NaiveScheduler(NaiveConfig(batch_size=4))


def continuous():
    return ContinuousScheduler(ContinuousConfig(max_num_seqs=4), num_kv_blocks=100)


def test_the_driver_counts_arrivals_at_their_planned_time_and_rows_at_their_own_end():
    _, changes = run(naive())
    # R1-R4 run as one batch from 6 to 12 but leave at their own last tokens (12, 9, 10, 8);
    # R5 arrived at 7 mid-batch and is released at 12, so its arrival is appended late.
    assert changes == [(0, 1), (1, 1), (5, 1), (6, 1), (12, -1), (9, -1), (10, -1), (8, -1), (7, 1), (17, -1)]


def test_intact_run_passes_the_check():
    reqs, changes = run(naive())
    out = littles_law(reqs, (0.0, 17.0), changes)      # E2E 12 + 8 + 5 + 2 + 10 = 37 request-seconds
    assert out["little_L"] == pytest.approx(37 / 17) and out["little_lambda_W"] == pytest.approx(37 / 17)
    assert abs(out["little_gap"]) < 1e-12


def test_a_request_lost_after_the_run_is_flagged():
    reqs, changes = run(naive())
    out = littles_law([r for r in reqs if r.request_id != "R3"], (0.0, 17.0), changes)
    assert out["little_gap"] == pytest.approx(37 / 32 - 1)       # R3's 5 s are counted, not stamped


def test_a_completion_stamp_moved_after_the_run_is_flagged():
    reqs, changes = run(naive())
    reqs[3].token_times[-1] += 3.0                               # R4 "finished" at 11, not 8
    assert littles_law(reqs, (0.0, 17.0), changes)["little_gap"] == pytest.approx(37 / 40 - 1)


class LateStamps(UnitStepBackend):
    """Stamps every token half a unit after the step really ended (a wrong clock read)."""

    async def step(self, step, clock):
        await clock.sleep(self.dt)
        for r, n in step.chunks:
            if r.num_computed_tokens + n >= r.num_tokens:
                r.stamp_token(clock.now() + 0.5)
        return 1


def test_a_backend_that_stamps_late_is_flagged():
    reqs, changes = run(continuous())                            # E2E 6 + 3 + 4 + 2 + 5 = 20
    assert abs(littles_law(reqs, (0.0, 12.0), changes)["little_gap"]) < 1e-12
    late, changes = run(continuous(), LateStamps())
    assert [r.completion_time for r in late] == [6.5, 4.5, 9.5, 8.5, 12.5]
    # the driver saw each request back at the step's end: 20 request-seconds, the stamps say 22.5
    assert littles_law(late, (0.0, 13.0), changes)["little_gap"] == pytest.approx(20 / 22.5 - 1)


def test_failed_requests_keep_the_out_of_memory_reason_and_leave_the_count():
    reqs, changes = run(naive(), UnitStepBackend(oom_above=3))
    assert [r.error for r in reqs[:4]] == ["out of memory — 4 rows > 3"] * 4
    assert reqs[4].status is Status.FINISHED and reqs[4].completion_time == 12
    out = littles_law(reqs, (0.0, 12.0), changes)                # only R5: 5 s over 12
    assert out["little_L"] == pytest.approx(5 / 12) and abs(out["little_gap"]) < 1e-12


def test_replicas_share_one_count_the_sum_over_replicas():
    cfg = load_config(None, ["continuous.num_kv_blocks=100"])
    reqs = make_requests([0, 0.5, 2, 3.5, 4.7], [10, 1, 1, 1, 1])
    occ, clock = Occupancy(), VirtualClock()
    clock.run(serve_replicated(reqs, make_replicas(cfg, "continuous", UnitStepBackend(), 2),
                               LeastOutstanding(), clock, occ))
    assert sorted(d for _, d in occ.changes) == [-1] * 5 + [1] * 5
    out = littles_law(reqs, (0.0, 10.0), occ.changes)            # E2E 10 + 1 + 1 + 1 + 1 over 10 s
    assert out["little_L"] == pytest.approx(14 / 10) and abs(out["little_gap"]) < 1e-12


def test_a_point_uses_the_drivers_count_and_rebases_it():
    cfg = load_config(None, ["traffic.warmup_s=0", "traffic.duration_s=20", "continuous.num_kv_blocks=100"])
    trace = [TraceItem(float(a), 1, o) for a, o in zip(ARRIVALS, OUTPUTS)]
    res = run_point(cfg, "continuous", 1.0, 0, UnitStepBackend(), trace=trace)
    assert res.summary["little_source"] == "driver"
    assert sorted(res.in_system) == sorted([(a, 1) for a in ARRIVALS] + [(e, -1) for e in (6, 4, 9, 8, 12)])
    assert res.summary["little_L"] == pytest.approx(20 / 20) and abs(res.summary["little_gap"]) < 1e-12


class FakeServer(LoadTarget):
    """Batches for itself: 1 ms per token, every request at once (real time: a server's sends
    spin on the clock, which virtual time cannot)."""

    def session(self, concurrency):
        return contextlib.nullcontext()

    async def send(self, request, session, clock):
        for _ in range(request.max_new_tokens):
            await clock.sleep(0.001)
            request.stamp_token(clock.now())
        finish(request)


@pytest.mark.timeout(60)
def test_a_server_backend_has_no_driver_so_the_stamps_stand_in_and_say_so():
    cfg = load_config(None, ["traffic.warmup_s=0", "traffic.duration_s=1"])
    trace = [TraceItem(a / 100, 1, o) for a, o in zip(ARRIVALS, OUTPUTS)]
    res = run_point(cfg, "server", 1.0, 0, FakeServer(), trace=trace)
    s = res.summary
    assert s["little_source"] == "stamps" and len(res.in_system) == 10      # from the stamps: in and out each
    assert s["little_L"] > 0 and abs(s["little_gap"]) < 1e-9     # every request inside [0, 1 s]


def test_a_front_end_delay_hands_over_a_request_whose_arrival_plus_delay_rounds_down():
    # (a + d) - d < a in floating point for these two: testing the arrival against now - d would
    # never hand the request over, and the loop would wake at a + d forever
    a, d = 0.12026867862137802, 0.0077927
    assert (a + d) - d < a
    reqs, clock = make_requests([a], [3]), VirtualClock()
    clock.run(drive(continuous(), UnitStepBackend(), clock, Inbox(reqs, delay_s=d)))
    assert reqs[0].status is Status.FINISHED and reqs[0].token_times[0] > a + d


class OwingBackend(UnitStepBackend):
    """UnitStepBackend that records the front-end time it is charged, and when."""

    def __init__(self, step: float = 1.0):
        super().__init__(step)
        self.charged: list[float] = []

    def front_end(self, seconds: float) -> None:
        self.charged.append(seconds)


def test_a_front_end_on_the_engines_processor_takes_requests_one_at_a_time():
    reqs, clock = make_requests([0.0, 0.0, 0.0, 10.0], [1, 1, 1, 1]), VirtualClock()
    inbox = Inbox(reqs, engine_s=0.25)
    assert list(inbox.due) == [0.25, 0.5, 0.75, 10.25]     # queued behind each other, then one alone
    backend = OwingBackend(step=1.0)
    clock.run(drive(continuous(), backend, clock, inbox))
    assert all(r.status is Status.FINISHED for r in reqs)
    # the first three came while the engine was idle or busy: only the part done while it ran a
    # step is owed (0.5 and 0.75 end inside the first step, which began at 0.25); the fourth came
    # to an idle engine and costs it nothing
    assert reqs[0].token_times[0] == pytest.approx(1.25)
    assert sum(backend.charged) == pytest.approx(0.5)


def test_a_front_end_on_the_engine_takes_longer_for_longer_prompts():
    # 0.1 s a request and 0.01 s a prompt token: prompts of 5 and 20 tokens take 0.15 and 0.3 s
    reqs = make_requests([0.0, 0.0, 10.0], [1, 1, 1], prompt_len=5)
    reqs[1].prompt_len = 20
    inbox = Inbox(reqs, engine_s=0.1, engine_s_per_token=0.01)
    assert list(inbox.due) == pytest.approx([0.15, 0.45, 10.15])
    backend, clock = OwingBackend(step=1.0), VirtualClock()
    clock.run(drive(continuous(), backend, clock, inbox))
    assert [r.token_times[0] for r in reqs] == pytest.approx([1.15, 2.15, 11.15])
    # the second's front end ran 0.15..0.45 while the first's step (0.15..1.15) ran: all of it owed
    assert sum(backend.charged) == pytest.approx(0.3)


def test_without_a_front_end_on_the_engine_nothing_is_charged():
    reqs, clock = make_requests([0.0, 0.0], [2, 2]), VirtualClock()
    backend = OwingBackend()
    clock.run(drive(continuous(), backend, clock, Inbox(reqs, delay_s=0.25)))
    assert backend.charged == [] and reqs[0].token_times[0] == pytest.approx(1.25)


def test_a_delay_beside_a_front_end_on_the_engine_hands_over_after_the_front_end_is_done():
    # the front end takes 0.25 s of the engine's processor per request, then each request waits
    # 0.5 s more off the engine (a validation's first-token delay) before the scheduler sees it
    reqs, clock = make_requests([0.0, 0.0, 10.0], [1, 1, 1]), VirtualClock()
    inbox = Inbox(reqs, delay_s=0.5, engine_s=0.25)
    assert inbox.next_arrival == pytest.approx(0.25)      # the loop wakes when the first front end is done
    backend = OwingBackend(step=1.0)
    clock.run(drive(continuous(), backend, clock, inbox))
    assert [r.token_times[0] for r in reqs] == pytest.approx([1.75, 2.75, 11.75])   # the second waits for the first's step
    # the engine was idle while the first two front ends ran (0 to 0.5) and the third's: nothing owed
    assert sum(backend.charged) == pytest.approx(0.0)
