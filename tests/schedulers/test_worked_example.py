"""The seed's worked example: five requests arriving at steps 0, 1, 5, 6, 7 needing 6, 3, 4, 2
and 5 decode steps, room for four, dynamic waiting at most 2 steps. Exact start and finish steps."""
import pytest

from batchlab.core.clock import VirtualClock
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import ContinuousConfig, ContinuousScheduler, DynamicConfig, DynamicScheduler, NaiveConfig, NaiveScheduler
from tests.fakes import UnitStepBackend, make_requests

ARRIVALS = [0, 1, 5, 6, 7]
OUTPUTS = [6, 3, 4, 2, 5]


def run(scheduler):
    reqs = make_requests(ARRIVALS, OUTPUTS)
    clock = VirtualClock()
    clock.run(drive(scheduler, UnitStepBackend(), clock, Inbox(reqs)))
    return {r.request_id: (r.scheduled_time, r.completion_time) for r in reqs}


def test_naive_waits_for_four_and_flushes_the_fifth_at_shutdown():
    got = run(NaiveScheduler(NaiveConfig(batch_size=4)))
    # R1-R4 start when R4 arrives (step 6); the batch holds its slots until the longest (6) ends
    # at 12; R5 never fills a batch and only runs in the shutdown flush.
    assert got == {"R1": (6, 12), "R2": (6, 9), "R3": (6, 10), "R4": (6, 8), "R5": (12, 17)}


def test_dynamic_launches_on_age_then_takes_everyone_waiting():
    got = run(DynamicScheduler(DynamicConfig(max_batch_size=4, max_wait_ms=2000)))
    # R1's age trigger fires at 2 with R2 aboard; R3-R5 arrive during that batch (ends at 8)
    # and launch together at 8, since R3 has already waited past its deadline.
    assert got == {"R1": (2, 8), "R2": (2, 5), "R3": (8, 12), "R4": (8, 10), "R5": (8, 13)}


def test_continuous_starts_on_arrival_and_leaves_when_done():
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), num_kv_blocks=100)
    got = run(sched)
    assert got == {"R1": (0, 6), "R2": (1, 4), "R3": (5, 9), "R4": (6, 8), "R5": (7, 12)}
    assert sched.free_blocks == 100  # every block came back


@pytest.mark.parametrize("make", [
    lambda: NaiveScheduler(NaiveConfig(batch_size=4)),
    lambda: DynamicScheduler(DynamicConfig(max_batch_size=4, max_wait_ms=2000)),
    lambda: ContinuousScheduler(ContinuousConfig(max_num_seqs=4), num_kv_blocks=100),
])
def test_every_request_gets_exactly_its_tokens(make):
    reqs = make_requests(ARRIVALS, OUTPUTS)
    clock = VirtualClock()
    clock.run(drive(make(), UnitStepBackend(), clock, Inbox(reqs)))
    for r in reqs:
        assert r.status.value == "finished"
        assert r.output_len == r.max_new_tokens
        assert r.arrival_time <= r.scheduled_time <= r.first_token_time <= r.completion_time
