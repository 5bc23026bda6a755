import math

from batchlab.core.config import SLOConfig
from batchlab.core.metrics import per_request, summarize
from batchlab.core.request import Request, Status


def finished(rid, arrival, scheduled, stamps):
    r = Request(rid, 4, len(stamps), arrival)
    r.scheduled_time = scheduled
    r.token_times = list(stamps)
    r.status = Status.FINISHED
    return r


def test_per_request_formulas():
    r = finished("a", 1.0, 1.5, [2.0, 2.5, 3.0, 4.0])
    m = per_request(r)
    assert m == {"queue_wait": 0.5, "ttft": 1.0, "tpot": (4.0 - 2.0) / 3, "e2e": 3.0}
    one = finished("b", 0.0, 0.0, [1.0])
    assert per_request(one)["tpot"] is None


def test_summary_throughput_goodput_and_failures_kept():
    a = finished("a", 0.0, 0.0, [1.0, 2.0])        # ttft 1, e2e 2
    b = finished("b", 1.0, 1.0, [3.0, 4.0, 5.0])   # ttft 2, e2e 4
    c = Request("c", 4, 3, 2.0)
    c.fail("boom")
    s = summarize([a, b, c], SLOConfig(ttft_s=1.5))
    assert s["num_requests"] == 3 and s["finished"] == 2 and s["failed"] == 1
    assert s["window_s"] == 5.0                     # first arrival 0 -> last completion 5
    assert s["throughput_tok_s"] == 5 / 5.0
    assert s["goodput"] == 1 / 5.0 and math.isclose(s["slo_attainment"], 1 / 3)
    assert s["ttft_p50"] == 1.5 and s["e2e_p99"] > 3.9
    assert s["itl_p50"] == 1.0


def test_littles_law_on_a_hand_made_run():
    # Two requests in the system over [0, 4]: [0, 2] and [1, 4]: area 5, window 4.
    reqs = [finished("a", 0.0, 0.0, [1.0, 2.0]), finished("b", 1.0, 1.0, [2.0, 4.0])]
    s = summarize(reqs)
    assert s["little_L"] == 5 / 4
    assert s["little_lambda_W"] == (2 / 4) * 2.5
