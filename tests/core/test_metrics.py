import math

import numpy as np
import pytest

from batchlab.core.config import SLOConfig
from batchlab.core.metrics import littles_law, per_request, percentile, summarize, time_average
from batchlab.core.request import Request, Status


def finished(rid, arrival, scheduled, stamps):
    r = Request(rid, 4, len(stamps), arrival)
    r.scheduled_time = scheduled
    r.token_times = list(stamps)
    r.status = Status.FINISHED
    return r


def failed(rid, arrival, error="boom", stamps=()):
    r = Request(rid, 4, 8, arrival)
    r.token_times = list(stamps)
    r.fail(error)
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
    c = failed("c", 2.0, stamps=[2.5])             # had a first token, then failed
    s = summarize([a, b, c], SLOConfig(ttft_s=1.5))
    assert s["num_requests"] == 3 and s["finished"] == 2 and s["failed"] == 1
    assert s["window_s"] == 5.0                     # first arrival 0 -> last completion 5
    assert s["throughput_tok_s"] == 5 / 5.0
    assert s["goodput"] == 1 / 5.0 and math.isclose(s["slo_attainment"], 1 / 3)
    # c counts as +inf, not as its 0.5 s first token and not left out: TTFT values 1, 2, inf
    assert s["ttft_p50"] == 2.0 and s["ttft_p90"] == math.inf and s["e2e_mean"] == math.inf
    assert s["itl_p50"] == 1.0                      # ITL pools finished requests' gaps only
    assert s["top_error"] == "boom"


def test_a_server_that_fails_its_slowest_requests_does_not_look_faster():
    e2e = np.arange(1.0, 101.0)                     # 100 requests, E2E 1..100 s
    honest = [finished(f"r{i}", 0.0, 0.0, [e]) for i, e in enumerate(e2e)]
    dropper = honest[:90] + [failed(f"x{i}", 0.0, "timeout") for i in range(10)]   # the 10 slowest time out
    s_honest, s_dropper = summarize(honest), summarize(dropper)
    assert s_honest["e2e_p95"] == pytest.approx(95.05)
    assert s_dropper["e2e_p95"] == math.inf         # the failures reach p95: it is not 85.55
    assert s_dropper["e2e_p50"] == s_honest["e2e_p50"]   # below the failures nothing moves
    assert s_dropper["failed"] == 10 and s_dropper["top_error"] == "timeout"


def test_percentile_is_numpys_for_finite_values_and_counts_inf_as_a_value():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1001):
        x = rng.exponential(1.0, n)
        for q in (0, 12.5, 50, 90, 95, 99, 100):
            assert percentile(x, q) == np.percentile(x, q)          # bit for bit
    assert percentile(np.array([1.0, 2.0, math.inf]), 50) == 2.0     # numpy: nan
    assert percentile(np.array([1.0, 2.0, math.inf]), 75) == math.inf
    assert percentile(np.array([1.0, math.inf, math.inf]), 90) == math.inf
    rows = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan]])  # NaN: missing, skipped
    out = percentile(rows, 50)
    assert out[0] == 2.0 and np.isnan(out[1])


def test_time_average_of_a_count_given_by_unordered_changes():
    # in the system: [0, 2] and [1, 4]; changes arrive out of order, as the driver appends them
    changes = [(1.0, 1), (0.0, 1), (4.0, -1), (2.0, -1)]
    assert time_average(changes, 0.0, 4.0) == 5 / 4
    assert time_average(changes, 1.0, 3.0) == (2 + 1) / 2            # 2 on [1, 2], 1 on [2, 3]
    assert time_average([], 0.0, 4.0) == 0.0


# A hand-made run with clean edges: the system is empty at 0 and at 5.
#   a: [0, 2]   b: [1, 4]   c: [3, 5]     area 2 + 3 + 2 = 7 over a 5 s window
RUN = [finished("a", 0.0, 0.0, [1.0, 2.0]), finished("b", 1.0, 1.0, [2.0, 4.0]), finished("c", 3.0, 3.0, [5.0])]
DRIVER = [(0.0, 1), (1.0, 1), (2.0, -1), (4.0, -1), (3.0, 1), (5.0, -1)]     # what the driver counted


def test_littles_law_holds_when_the_driver_and_the_stamps_agree():
    out = littles_law(RUN, (0.0, 5.0), DRIVER)
    assert out["little_L"] == 7 / 5
    assert out["little_lambda_W"] == pytest.approx(3 / 5 * 7 / 3)    # lambda 0.6/s x mean E2E 7/3 s
    assert abs(out["little_gap"]) < 1e-12 and out["little_source"] == "driver"


def test_littles_law_flags_a_request_the_stamps_lost():
    out = littles_law(RUN[:1] + RUN[2:], (0.0, 5.0), DRIVER)          # b counted by the driver, gone from the set
    assert out["little_L"] == 7 / 5
    assert out["little_lambda_W"] == pytest.approx(2 / 5 * 2)
    assert out["little_gap"] == pytest.approx(7 / 4 - 1)              # +75%: far outside the edge noise


def test_littles_law_flags_a_shifted_completion_stamp():
    shifted = [finished("a", 0.0, 0.0, [1.0, 2.0]), finished("b", 1.0, 1.0, [2.0, 5.5]), RUN[2]]
    out = littles_law(shifted, (0.0, 5.0), DRIVER)
    assert out["little_lambda_W"] == pytest.approx(3 / 5 * 8.5 / 3)
    assert out["little_gap"] == pytest.approx(7 / 8.5 - 1)            # -18%


def test_without_a_driver_the_stamps_count_and_say_so():
    out = littles_law(RUN, (0.0, 5.0))
    assert out["little_source"] == "stamps" and abs(out["little_gap"]) < 1e-12
    edge = littles_law(RUN, (0.0, 4.0))      # c is in the system after the window: edge effect, not a bug
    assert edge["little_L"] == (2 + 3 + 1) / 4 and edge["little_lambda_W"] == pytest.approx(3 / 4 * 7 / 3)


def test_littles_law_counts_finished_requests_only_and_is_nan_only_for_an_empty_window():
    out = littles_law(RUN + [failed("x", 2.0)], (0.0, 5.0), DRIVER)  # the driver leaves failures out too
    assert abs(out["little_gap"]) < 1e-12
    none = littles_law([failed("x", 2.0)], (0.0, 5.0), [])
    assert (none["little_L"], none["little_lambda_W"], none["little_gap"]) == (0.0, 0.0, 0.0)
    assert math.isnan(littles_law(RUN, (5.0, 5.0), DRIVER)["little_L"])
