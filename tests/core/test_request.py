import dataclasses

import pytest

from batchlab.core.metrics import Response
from batchlab.core.request import Request, Status


def test_derived_stamps_follow_the_token_times():
    r = Request("a", 4, 3, arrival_time=1.0)
    assert r.first_token_time is None and r.completion_time is None
    r.scheduled_time = 1.5
    for t, tok in ((2.0, 7), (2.5, 8), (3.5, 9)):
        r.stamp_token(t, tok)
    assert r.first_token_time == 2.0 and r.completion_time is None   # not finished yet
    r.status = Status.FINISHED
    assert r.completion_time == 3.5 and r.num_tokens == 7 and r.output_len == 3


def test_response_is_a_frozen_snapshot_with_the_metrics():
    r = Request("a", 4, 3, arrival_time=1.0)
    r.scheduled_time = 1.5
    for t, tok in ((2.0, 7), (2.5, 8), (3.5, 9)):
        r.stamp_token(t, tok)
    r.status = Status.FINISHED
    resp = Response.of(r)
    assert (resp.queue_wait, resp.ttft, resp.tpot, resp.e2e) == (0.5, 1.0, 0.75, 2.5)
    assert resp.output_token_ids == (7, 8, 9) and resp.error is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        resp.ttft = 0.0
    failed = Request("b", 4, 3, arrival_time=0.0)
    failed.fail("boom")
    assert Response.of(failed).status is Status.FAILED and Response.of(failed).error == "boom"
