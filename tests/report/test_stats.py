import numpy as np
import pandas as pd
import pytest

from batchlab.report import stats


def test_bootstrap_over_repeats_covers_a_known_paired_difference():
    rng = np.random.default_rng(1)
    trace_effect = rng.normal(0, 5, size=20)              # shared by both strategies: pairing cancels it
    a = 10 + 2.0 + trace_effect + rng.normal(0, 0.5, 20)
    b = 10 + trace_effect + rng.normal(0, 0.5, 20)
    iv = stats.bootstrap_paired(a, b, stats.mean_stat, stats.iid_indices(20, rng))
    assert iv.low < 2.0 < iv.high
    assert iv.excludes_zero and iv.high - iv.low < 1.5     # paired: the trace noise (sd 5) is gone
    assert iv.rel_low < iv.rel < iv.rel_high


def test_bootstrap_interval_has_roughly_its_nominal_coverage():
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(200):
        d = rng.normal(1.0, 1.0, size=40)
        iv = stats.bootstrap_paired(d, np.zeros(40), stats.mean_stat, stats.iid_indices(40, rng, n_boot=400))
        hits += iv.low <= 1.0 <= iv.high
    assert 0.85 <= hits / 200 <= 0.99


def test_no_difference_gives_an_interval_that_includes_zero():
    rng = np.random.default_rng(3)
    x = rng.exponential(1.0, 3000)
    a, b = x + rng.normal(0, 0.01, 3000), x + rng.normal(0, 0.01, 3000)
    iv = stats.bootstrap_paired(a, b, stats.percentile_stat(50), stats.block_indices(3000, rng))
    assert iv.low <= 0 <= iv.high and not iv.excludes_zero


def test_block_bootstrap_of_a_percentile_covers_a_known_shift():
    rng = np.random.default_rng(5)
    base = rng.exponential(1.0, 2000)
    a, b = base * 1.5, base                               # p50 of a is exactly 1.5 x p50 of b
    iv = stats.bootstrap_paired(a, b, stats.percentile_stat(50), stats.block_indices(2000, rng))
    true = np.percentile(a, 50) - np.percentile(b, 50)
    assert iv.low <= true <= iv.high
    assert iv.rel == pytest.approx(0.5)


def test_block_indices_are_runs_of_consecutive_requests():
    idx = stats.block_indices(100, np.random.default_rng(0), n_boot=5, block=10)
    assert idx.shape == (5, 100)
    steps = np.diff(idx[:, :10], axis=1) % 100
    assert (steps == 1).all()


def test_nan_rows_are_ignored_by_the_percentile():
    x = np.array([[1.0, np.nan, 3.0]])
    assert stats.percentile_stat(50)(x)[0] == 2.0


def test_crossover_is_interpolated_between_the_rates_where_the_leader_changes():
    # a - b = -1, -0.5, +0.1, +2: a takes the lead between 2 and 3 req/s
    out = stats.crossover_rates([1, 2, 3, 4], [1, 2, 3, 4], [2, 2.5, 2.9, 2])
    assert len(out) == 1
    rate, before, after = out[0]
    assert rate == pytest.approx(2 + 0.5 / 0.6)
    assert (before, after) == (-1, 1)


def test_ties_do_not_make_crossovers_and_lower_can_be_better():
    assert stats.crossover_rates([1, 2, 3], [100, 101, 100], [100.5, 100, 100.8]) == []   # all within 2%
    out = stats.crossover_rates([1, 2], [1.0, 3.0], [2.0, 2.0], lower_is_better=True)
    assert [(b, a) for _, b, a in out] == [(1, -1)]   # a's latency is lower first, then higher


def summary(rows):
    return pd.DataFrame(rows, columns=["strategy", "rate", "repeat", "throughput_tok_s", "slo_attainment"])


def test_crossovers_on_a_summary_names_who_leads_before_and_after():
    s = summary([("x", 5, 0, 100, 1), ("y", 5, 0, 150, 1), ("x", 20, 0, 400, 1), ("y", 20, 0, 200, 1)])
    [c] = stats.crossovers(s, "x", "y", metrics=("throughput_tok_s",))
    assert (c.leader_before, c.leader_after) == ("y", "x")
    assert 5 < c.rate < 20


def test_knee_is_the_highest_rate_meeting_the_slo():
    s = summary([("x", 5, 0, 1, 0.99), ("x", 10, 0, 1, 0.95), ("x", 20, 0, 1, 0.5), ("x", 40, 0, 1, 0.0),
                 ("z", 5, 0, 1, 0.2)])
    assert stats.knee(s, "x") == 10
    assert stats.knee(s, "z") is None


def test_compare_uses_repeats_when_there_are_enough():
    rows = []
    rng = np.random.default_rng(0)
    for rep in range(5):
        base = rng.normal(1000, 100)
        rows += [("a", 10, rep, base * 1.2, 1.0), ("b", 10, rep, base, 1.0)]
    s = summary(rows)
    out = stats.compare(s, None, "a", "b", metrics=("throughput_tok_s",))
    r = out.iloc[0]
    assert "5 repeats" in r["method"] and r["supported"]
    assert r["rel_low"] <= 0.2 <= r["rel_high"]


def test_compare_with_one_repeat_bootstraps_requests_and_gives_whole_run_metrics_no_interval():
    rng = np.random.default_rng(0)
    n = 400
    base = rng.exponential(1.0, n)
    req = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)] * 2, "strategy": ["a"] * n + ["b"] * n,
                        "rate": 10.0, "repeat": 0, "warmup": 0, "arrival_time": list(np.arange(n) / 10) * 2,
                        "ttft": np.r_[base * 0.5, base], "e2e": np.r_[base + 1, base + 2]})
    s = pd.DataFrame({"strategy": ["a", "b"], "rate": 10.0, "repeat": 0, "throughput_tok_s": [110.0, 100.0],
                      "goodput": [1.0, 1.0], "ttft_p50": [np.median(base) * 0.5, np.median(base)],
                      "e2e_p50": [np.median(base) + 1, np.median(base) + 2]})
    out = stats.compare(s, req, "a", "b", metrics=("ttft_p50", "e2e_p50", "throughput_tok_s")).set_index("metric")
    assert out.loc["ttft_p50", "rel"] == pytest.approx(-0.5)
    assert out.loc["ttft_p50", "supported"] and "block bootstrap over 400 requests" in out.loc["ttft_p50", "method"]
    assert out.loc["e2e_p50", "low"] <= -1.0 <= out.loc["e2e_p50", "high"]
    assert np.isnan(out.loc["throughput_tok_s", "low"]) and not out.loc["throughput_tok_s", "supported"]
    assert out.loc["throughput_tok_s", "method"] == "one run per strategy"


def test_past_capacity_means_a_growing_queue_not_a_slow_last_batch():
    t = np.arange(0, 60, 0.5)
    cyclic = (t % 16)                    # naive at light load: waits to fill, then starts over
    growing = 0.6 * t                    # overloaded: every request waits longer than the last
    req = pd.DataFrame({"strategy": ["light"] * len(t) + ["over"] * len(t), "rate": 2.0, "repeat": 0,
                        "warmup": 0, "status": "finished", "arrival_time": np.r_[t, t],
                        "queue_wait": np.r_[cyclic, growing]})
    assert stats.past_capacity(None, req) == {("over", 2.0)}
    s = pd.DataFrame({"strategy": ["a", "b"], "rate": [20.0, 20.0], "requests_per_s": [19.5, 6.5]})
    assert stats.past_capacity(s, None) == {("b", 20.0)}
