"""The one rule for "sustains": the SLO met by >= 90 % of requests AND >= 95 % of the offered
requests/s served. A point can pass the first and fail the second (a queue that grows through a
short run); the knee is the highest sustained rate, and what broke above it is named."""
import numpy as np
import pandas as pd
import pytest

from batchlab.report import capacity

SLO = {"ttft_s": 1.0, "tpot_s": 0.05}


def summary(rows):
    """rows: (strategy, rate, served req/s, attainment), one repeat each."""
    return pd.DataFrame([{"strategy": s, "rate": r, "repeat": 0, "requests_per_s": done, "slo_attainment": att}
                         for s, r, done, att in rows])


def test_the_knee_is_the_highest_rate_that_meets_the_slo_and_keeps_up():
    s = summary([("x", 5, 5.0, 0.99), ("x", 10, 9.8, 0.95), ("x", 20, 19.9, 0.5), ("x", 40, 21.0, 0.0),
                 ("z", 5, 5.0, 0.2)])
    caps = capacity.capacities(s, None, SLO)
    assert (caps["x"].rate, caps["x"].broke_at, caps["x"].highest_tried) == (10, 20, False)
    assert caps["z"].rate is None and caps["z"].broke_at == 5
    assert capacity.ranked(caps) == ["x", "z"]


def test_a_point_that_meets_the_slo_but_falls_behind_is_not_sustained():
    # 64 req/s offered, every finished request fast, but only 90 % of the offered rate served:
    # the backlog is being served after the traffic stops (DESIGN.md's vLLM comparison).
    s = summary([("x", 32, 32.0, 1.0), ("x", 64, 0.90 * 64, 0.97)])
    table = capacity.sustained(s, None, SLO).set_index("rate")
    assert table.loc[32, "sustained"] and not table.loc[64, "sustained"]
    assert table.loc[64, "served"] == pytest.approx(0.90)
    assert capacity.capacities(s, None, SLO)["x"].rate == 32
    assert capacity.capacities(s, None, {})["x"].rate == 32          # no SLO: keeping up is the whole rule


def requests_for(strategy, nominal, arrivals_per_s, n, ttft, tpot, status="finished"):
    t = np.arange(n) / arrivals_per_s
    return pd.DataFrame({"strategy": strategy, "rate": float(nominal), "repeat": 0, "warmup": 0, "status": status,
                         "arrival_time": t, "ttft": ttft, "tpot": tpot})


def test_offered_rate_comes_from_the_arrivals_and_the_limit_names_the_metric_that_missed():
    # A Poisson sample can run 6 % above its nominal rate: served is judged against what arrived.
    s = summary([("x", 10, 10.6, 1.0), ("x", 20, 21.0, 0.5)])
    req = pd.concat([requests_for("x", 10, 10.6, 200, 0.1, 0.01), requests_for("x", 20, 21.0, 200, 0.2, 0.08)])
    served = capacity.sustained(s, req, SLO).set_index("rate")["served"]
    assert served[10] == pytest.approx(1.0, rel=1e-3)
    cap = capacity.capacities(s, req, SLO)["x"]
    assert (cap.rate, cap.broke_at, cap.limit) == (10, 20, ("TPOT",))


def test_failed_requests_meet_no_threshold_and_a_falling_behind_point_says_throughput():
    s = summary([("x", 10, 5.0, 0.5)])
    req = requests_for("x", 10, 10, 100, 0.1, 0.01).assign(status=["failed"] * 50 + ["finished"] * 50)
    cap = capacity.capacities(s, req, SLO)["x"]
    assert cap.rate is None and cap.limit == ("TTFT", "TPOT", "throughput")
    assert capacity.metric_attainment(req, "x", 10, SLO) == {"TTFT": 0.5, "TPOT": 0.5}


def test_the_compared_rate_is_fixed_in_advance_by_the_better_strategys_knee():
    caps = {"a": capacity.Capacity("a", 20.0, False, 50.0), "b": capacity.Capacity("b", None, False, 5.0)}
    assert capacity.telling_rate(caps, "a", [5.0, 20.0, 50.0]) == 20.0
    assert capacity.telling_rate(caps, "a", [5.0, 50.0]) == 5.0                      # 20 not run by both
    assert capacity.telling_rate(caps, "b", [5.0, 20.0, 50.0]) == 5.0                # none sustained: the lowest
