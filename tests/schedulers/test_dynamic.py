import pytest

from batchlab.core.clock import VirtualClock
from batchlab.core.request import Request
from batchlab.core.work import Batch, Idle, MemoryBudget
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import DynamicConfig, DynamicScheduler
from tests.fakes import UnitStepBackend, make_requests


def test_size_trigger_fires_before_the_deadline():
    s = DynamicScheduler(DynamicConfig(max_batch_size=2, max_wait_ms=1000))
    for r in make_requests([0, 0.1, 0.2], [1, 1, 1]):
        s.add(r)
    out = s.schedule(0.2)
    assert isinstance(out, Batch) and out.trigger == "size"
    assert [r.request_id for r in out.requests] == ["R1", "R2"]


def test_waits_until_the_oldest_request_is_max_wait_old():
    s = DynamicScheduler(DynamicConfig(max_batch_size=8, max_wait_ms=50))
    s.add(Request("a", 4, 4, arrival_time=1.0))
    out = s.schedule(1.01)
    assert isinstance(out, Idle) and abs(out.wake_at - 1.05) < 1e-12
    out = s.schedule(1.05)
    assert isinstance(out, Batch) and out.trigger == "age"


def test_memory_trigger_is_padding_aware():
    # Each row costs (longest prompt + longest output) x 1 byte; budget 100 bytes.
    mem = MemoryBudget(budget_bytes=100, kv_bytes_per_token=1)
    s = DynamicScheduler(DynamicConfig(max_batch_size=8, max_wait_ms=1000), mem)
    s.add(Request("short1", 10, 10, 0.0))
    s.add(Request("short2", 10, 10, 0.0))
    s.add(Request("long", 40, 10, 0.0))   # with it, 3 rows x 50 = 150 > 100
    out = s.schedule(0.0)
    assert isinstance(out, Batch) and out.trigger == "memory"
    assert [r.request_id for r in out.requests] == ["short1", "short2"]


def test_one_oversized_request_still_runs_alone():
    mem = MemoryBudget(budget_bytes=10, kv_bytes_per_token=1)
    s = DynamicScheduler(DynamicConfig(max_batch_size=8, max_wait_ms=0), mem)
    s.add(Request("huge", 100, 100, 0.0))
    s.add(Request("next", 1, 1, 0.0))
    out = s.schedule(0.0)
    assert [r.request_id for r in out.requests] == ["huge"]


def test_oom_puts_the_batch_back_in_order_and_halves_the_cap():
    s = DynamicScheduler(DynamicConfig(max_batch_size=8, max_wait_ms=0, oom_probe_after=3))
    reqs = make_requests([0] * 9, [2] * 9)
    for r in reqs:
        s.add(r)
    batch = s.schedule(0.0)
    assert len(batch.requests) == 8
    s.finish_batch(batch, 1.0, oom=True)
    assert s.cap == 4
    assert [r.request_id for r in s.waiting] == [f"R{i}" for i in range(1, 10)]
    assert all(r.status.value == "queued" for r in s.waiting)
    # three clean batches later the cap probes up by one
    for _ in range(3):
        b = s.schedule(1.0)
        assert len(b.requests) == 4
        s.finish_batch(b, 2.0)
        for r in b.requests:
            s.add(Request(r.request_id + "'", 1, 1, 2.0))
    assert s.cap == 5


def test_oom_back_off_end_to_end_loses_nothing():
    backend = UnitStepBackend(oom_above=3)
    s = DynamicScheduler(DynamicConfig(max_batch_size=8, max_wait_ms=0))
    reqs = make_requests([0] * 8, [3] * 8)
    clock = VirtualClock()
    clock.run(drive(s, backend, clock, Inbox(reqs)))
    assert all(r.status.value == "finished" and r.output_len == 3 for r in reqs)
    assert max(len(b) for b in backend.batches) <= 3
    assert s.cap <= 3


def test_a_request_that_ooms_alone_fails_with_a_reason_instead_of_looping():
    backend = UnitStepBackend(oom_above=0)
    reqs = make_requests([0], [2])
    clock = VirtualClock()
    clock.run(drive(DynamicScheduler(DynamicConfig(max_wait_ms=0)), backend, clock, Inbox(reqs)))
    assert reqs[0].status.value == "failed" and "out of memory" in reqs[0].error
    assert "1 rows > 0" in reqs[0].error          # the backend's reason survives the back-off path


def grouped(cap=2, skips=4):
    return DynamicScheduler(DynamicConfig(max_batch_size=cap, max_wait_ms=1000, group_by_length=True, max_skips=skips))


def test_grouping_fills_a_batch_with_the_lengths_closest_to_the_oldest():
    s = grouped(cap=2)
    for rid, p in (("old", 100), ("far", 1000), ("near", 110)):
        s.add(Request(rid, p, 20, 0.0))
    out = s.schedule(0.0)
    assert [r.request_id for r in out.requests] == ["old", "near"]       # the oldest always goes
    assert [r.request_id for r in s.waiting] == ["far"] and s.skips == {"far": 1}


@pytest.mark.parametrize("skips, far_in", [(1, 1), (10, 2)])
def test_a_request_passed_over_max_skips_times_goes_next_whatever_its_length(skips, far_in):
    """Behind the oldest: one unlike request (x) and one unlike everyone (far). Each batch takes the
    oldest and the one closest to it; far is passed over until it has been skipped max_skips times."""
    s = grouped(cap=2, skips=skips)
    for i, (rid, p) in enumerate([("o", 100), ("x", 1000), ("far", 5000)] + [(f"n{i}", 100) for i in range(4)]):
        s.add(Request(rid, p, 20, float(i)))
    launched = []
    while s.waiting:
        out = s.schedule(10.0)
        launched.append([r.request_id for r in out.requests])
        s.finish_batch(out, 10.0)
    assert launched[0] == ["o", "n0"]
    assert next(i for i, b in enumerate(launched) if "far" in b) == far_in
    assert sorted(r for b in launched for r in b) == sorted(["o", "x", "far", "n0", "n1", "n2", "n3"])   # nothing lost


def test_with_no_skips_allowed_the_line_is_kept():
    s = grouped(cap=2, skips=0)
    for rid, p in (("old", 100), ("far", 1000), ("near", 110)):
        s.add(Request(rid, p, 20, 0.0))
    assert [r.request_id for r in s.schedule(0.0).requests] == ["old", "far"]


def test_without_grouping_the_line_is_kept():
    s = DynamicScheduler(DynamicConfig(max_batch_size=2, max_wait_ms=1000))
    for rid, p in (("old", 100), ("far", 1000), ("near", 110)):
        s.add(Request(rid, p, 20, 0.0))
    assert [r.request_id for r in s.schedule(0.0).requests] == ["old", "far"]
