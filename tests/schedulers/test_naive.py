from batchlab.core.work import Batch, Idle
from batchlab.schedulers import NaiveConfig, NaiveScheduler
from tests.fakes import make_requests


def test_waits_for_exactly_n():
    s = NaiveScheduler(NaiveConfig(batch_size=3))
    reqs = make_requests([0, 1, 2, 3], [1] * 4)
    for r in reqs[:2]:
        s.add(r)
    assert isinstance(s.schedule(2.0), Idle)
    s.add(reqs[2]), s.add(reqs[3])
    out = s.schedule(3.0)
    assert isinstance(out, Batch) and [r.request_id for r in out.requests] == ["R1", "R2", "R3"]
    assert all(r.scheduled_time == 3.0 for r in out.requests)
    assert isinstance(s.schedule(3.0), Idle)  # one batch at a time


def test_flushes_the_remainder_when_draining():
    s = NaiveScheduler(NaiveConfig(batch_size=3))
    s.add(make_requests([0], [1])[0])
    out = s.schedule(5.0, draining=True)
    assert isinstance(out, Batch) and out.trigger == "drain" and len(out.requests) == 1


def test_out_of_memory_fails_the_batch_with_a_reason():
    s = NaiveScheduler(NaiveConfig(batch_size=2))
    reqs = make_requests([0, 0], [1, 1])
    for r in reqs:
        s.add(r)
    b = s.schedule(0.0)
    s.finish_batch(b, 1.0, oom=True)
    assert [r.status.value for r in reqs] == ["failed", "failed"]
    assert s.rejected == reqs and reqs[0].error == "out of memory"
