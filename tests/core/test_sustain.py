"""The one rule for "sustains", on synthetic requests: one point judged alone (a server that keeps
up, a queue growing fast or slowly, SLO percentiles, failures, a rate past saturation), the slope it
reads, and the two measures of a burst."""
import math

import numpy as np
import pytest

from batchlab.core.config import SLOConfig
from batchlab.core.request import Request, Status
from batchlab.core.sustain import (
    GROWTH,
    SERVED,
    burst_figures,
    judge,
    makespan_rate,
    queue_slope,
    saturated_rate,
    ttft_slope,
)

SLO = SLOConfig(ttft_s=2.0, tpot_s=0.05)
LO, HI = 2.0, 32.0


def requests(rate: float, ttft, gap: float = 0.01, n_out: int = 8, horizon: float = 32.0) -> list[Request]:
    """Evenly spaced arrivals over [0, horizon); each request's first token `ttft(arrival)` after
    it arrives, then one token every `gap` seconds."""
    out = []
    for i in range(int(rate * horizon)):
        a = i / rate
        r = Request(f"r{i}", 8, n_out, a)
        first = a + ttft(a)
        r.token_times = [first + k * gap for k in range(n_out)]
        r.status = Status.FINISHED
        out.append(r)
    return out


def test_a_server_that_keeps_up_sustains():
    v = judge(requests(10.0, lambda a: 0.05), LO, HI, SLO)
    assert v.sustained and v.why == ()
    assert v.served_share == pytest.approx(1.0, abs=0.01)
    assert v.window_tok_s == pytest.approx(80.0, rel=0.02)       # 10 req/s x 8 tokens
    assert abs(v.ttft_slope) < 1e-6
    assert v.record() == {"served_share": v.served_share, "window_tok_s": v.window_tok_s, "ttft_slope": v.ttft_slope,
                          "sustained": True, "why": []}


def test_a_growing_queue_fails_on_served_share_and_on_its_slope():
    """The wait grows by 0.5 s per second of arrivals: the window served less and the slope shows."""
    v = judge(requests(10.0, lambda a: 0.5 * a), LO, HI)
    assert not v.sustained
    assert any(w.startswith("served") for w in v.why) and any(w.startswith("queue growing") for w in v.why)
    assert v.ttft_slope == pytest.approx(0.5, rel=0.01)


def test_a_slow_growing_queue_is_caught_by_the_served_share_alone():
    """Slope 0.08 s/s is under GROWTH (0.1 s/s), but 8 % of the window's work is late."""
    v = judge(requests(10.0, lambda a: 0.08 * a), LO, HI)
    assert 0.08 < GROWTH and v.served_share < SERVED
    assert any(w.startswith("served") for w in v.why) and not any(w.startswith("queue") for w in v.why)


def test_slo_percentiles_and_failures_are_named_in_order():
    reqs = requests(10.0, lambda a: 0.05, gap=0.06)
    late = [r for r in reqs if r.arrival_time >= LO][:3]
    for r in late:
        r.token_times = [r.arrival_time + 2.5]
        r.status = Status.FAILED
    v = judge(reqs, LO, HI, SLO)
    assert v.why[:3] == ("3 failed", "TPOT p99", "TTFT p99")
    assert not v.sustained


def test_failures_and_slow_requests_before_the_window_do_not_count():
    reqs = requests(10.0, lambda a: 5.0 if a < LO else 0.05)
    reqs[0].status = Status.FAILED
    assert judge(reqs, LO, HI, SLO).sustained


def test_a_rate_at_or_above_what_the_setting_completes_saturated_fails():
    reqs = requests(10.0, lambda a: 0.05)
    assert judge(reqs, LO, HI, rate=10.0, saturated=12.0).sustained
    assert judge(reqs, LO, HI, rate=10.0, saturated=math.nan).sustained     # none measured: no verdict
    v = judge(reqs, LO, HI, rate=10.0, saturated=9.5)
    assert v.why == ("at or above the 9.5 req/s it completes saturated",)


def test_the_slope_is_a_least_squares_line_and_needs_three_points():
    assert queue_slope([0, 1, 2, 3], [1, 1.5, 2, 2.5]) == pytest.approx(0.5)
    assert math.isnan(ttft_slope(requests(10.0, lambda a: 0.05, horizon=0.2), 0.0))
    assert ttft_slope(requests(10.0, lambda a: 0.2 * a), 0.0) == pytest.approx(0.2, rel=1e-6)


def burst(n: int, batch: int, step: float = 0.1) -> list[Request]:
    """n requests arriving at 0, served `batch` at a time, each batch taking `step` seconds."""
    out = []
    for i in range(n):
        r = Request(f"b{i}", 8, 1, 0.0)
        r.token_times, r.status = [(i // batch + 1) * step], Status.FINISHED
        out.append(r)
    return out


def test_a_deep_burst_measures_its_steady_middle_and_a_shallow_one_its_whole_span():
    deep = burst(400, 8)                                         # 50 batches: 80 req/s once it runs
    assert saturated_rate(deep) == pytest.approx(80.0, rel=0.05)
    assert makespan_rate(deep) == pytest.approx(80.0)
    shallow = burst(96, 96, step=2.0)                            # one batch: every request ends together
    assert makespan_rate(shallow) == pytest.approx(48.0)
    assert math.isinf(saturated_rate(shallow))                   # no middle to measure: why makespan_rate exists


def test_a_bursts_gap_is_its_typical_step_where_tpot_carries_the_prompt_steps():
    """Rows that decode in 10-ms steps, every fourth step 100 ms (others' prompts computed in it):
    the median gap reads the decode step, the median TPOT the mean that includes the long ones."""
    reqs = []
    for i in range(12):
        r = Request(f"r{i}", 8, 9, 0.0)
        r.token_times = list(np.cumsum([0.5 + i] + [0.1 if k % 4 == 3 else 0.01 for k in range(8)]))
        r.status = Status.FINISHED
        reqs.append(r)
    slow = Request("late", 8, 9, 0.0)                 # a request that never finished: none of its gaps count
    slow.token_times, slow.status = [1.0, 3.0, 5.0], Status.FAILED
    got = burst_figures([*reqs, slow])
    assert got["gap_p50"] == pytest.approx(0.01)
    assert got["tpot_p50"] == pytest.approx((6 * 0.01 + 2 * 0.1) / 8)
    assert math.isnan(burst_figures([slow])["gap_p50"])
