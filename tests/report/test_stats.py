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


def test_t_quantiles_match_the_tables():
    for df, t in ((1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423), (200, 1.9719)):
        assert stats.t_quantile(0.95, df) == pytest.approx(t, abs=1e-4)
    assert stats.t_quantile(0.90, 4) == pytest.approx(2.1318, abs=1e-4)


def experiments(n_repeats, true_diff, seed, n=2000):
    """n seeded paired experiments of n_repeats traces each: a trace effect both strategies share
    (sd 5, which pairing cancels), per-run noise (sd 1), and a known true difference."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        trace = rng.normal(0, 5, n_repeats)
        yield 100 + true_diff + trace + rng.normal(0, 1, n_repeats), 100 + trace + rng.normal(0, 1, n_repeats), rng


@pytest.mark.parametrize("repeats", [3, 5])
def test_the_interval_over_repeats_has_its_nominal_coverage_and_false_claim_rate(repeats):
    # 2,000 experiments: the binomial sd of a 95% rate is 0.5 points, so +-2 points is 4 sd
    intervals = (stats.t_paired(a, b) for a, b, _ in experiments(repeats, 2.0, seed=repeats))
    covered = sum(iv.low <= 2.0 <= iv.high for iv in intervals)
    claimed = sum(stats.t_paired(a, b).excludes_zero for a, b, _ in experiments(repeats, 0.0, seed=100 + repeats))
    assert 0.93 <= covered / 2000 <= 0.97
    assert 0.03 <= claimed / 2000 <= 0.07


def test_the_coverage_check_catches_a_percentile_bootstrap_over_three_repeats():
    # what compare() used before: roughly [min, max] of 3 differences, claiming a change with no
    # true difference about a quarter of the time. The test above would fail it.
    claimed = sum(stats.bootstrap_paired(a, b, stats.mean_stat, stats.iid_indices(3, rng, n_boot=200)).excludes_zero
                  for a, b, rng in experiments(3, 0.0, seed=103, n=1000))
    assert claimed / 1000 > 0.15


def repeats_summary(a_e2e, b_e2e, a_failed=0, b_failed=0, n=100):
    rows = []
    for rep, (x, y) in enumerate(zip(a_e2e, b_e2e)):
        rows += [("a", 10.0, rep, x, n, n - a_failed, a_failed), ("b", 10.0, rep, y, n, n - b_failed, b_failed)]
    return pd.DataFrame(rows, columns=["strategy", "rate", "repeat", "e2e_p50", "num_requests", "finished", "failed"])


def test_compare_with_three_repeats_uses_the_t_interval():
    a, b = [1.0, 1.3, 0.9], [1.5, 1.6, 1.45]
    row = stats.compare(repeats_summary(a, b), None, "a", "b", metrics=("e2e_p50",)).iloc[0]
    iv = stats.t_paired(np.array(a), np.array(b))
    assert row["method"] == "t-interval over 3 repeats"
    assert (row["low"], row["high"]) == pytest.approx((iv.low, iv.high))
    d = np.array(a) - np.array(b)                   # by hand: mean -0.45, sd 0.15, t(2) = 4.303
    assert row["high"] == pytest.approx(d.mean() + 4.3027 * d.std(ddof=1) / np.sqrt(3), abs=1e-4)


def test_a_strategy_with_more_failures_is_never_called_faster():
    a, b = [1.0, 1.1, 0.9, 1.0, 1.05], [2.0, 2.1, 1.9, 2.0, 2.05]      # a clearly lower
    fair = stats.compare(repeats_summary(a, b), None, "a", "b", metrics=("e2e_p50",)).iloc[0]
    assert fair["supported"] and fair["note"] == ""
    dropper = stats.compare(repeats_summary(a, b, a_failed=3), None, "a", "b", metrics=("e2e_p50",)).iloc[0]
    assert not dropper["supported"] and dropper["note"] == "a failed more requests (15 of 500 vs 0 of 500)"
    assert (dropper["a_failed"], dropper["b_failed"], dropper["a_requests"]) == (15, 0, 500)
    # the slower side failing more changes nothing: it is not the one called faster
    slower_drops = stats.compare(repeats_summary(a, b, b_failed=3), None, "a", "b", metrics=("e2e_p50",)).iloc[0]
    assert slower_drops["supported"]


def test_paired_ttft_counts_a_failed_request_as_inf_like_the_summary():
    from batchlab.core.metrics import percentile
    n = 9
    ttft = np.arange(1.0, n + 1)
    req = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)] * 2, "strategy": ["a"] * n + ["b"] * n,
                        "rate": 10.0, "repeat": 0, "warmup": 0, "arrival_time": list(np.arange(n) / 10) * 2,
                        "status": ["finished"] * n + ["finished"] * (n - 4) + ["failed"] * 4,
                        "ttft": np.r_[ttft, ttft]})    # b's 4 slowest failed after their first token
    va, vb = stats._paired_requests(req, "a", "b", 10.0, 0, "ttft")
    assert list(vb[-4:]) == [np.inf] * 4 and list(va) == list(ttft)
    # the same set as summary.csv: b's p50 TTFT is 5 there and here, not 3 (its finished ones)
    assert stats.percentile_stat(50)(vb[None, :])[0] == percentile(np.r_[ttft[:5], [np.inf] * 4], 50) == 5.0
    assert stats.percentile_stat(90)(vb[None, :])[0] == np.inf


def test_a_crossover_never_hands_the_lead_to_a_strategy_that_fails_more():
    s = pd.DataFrame({"strategy": ["x", "y"] * 3, "rate": [1.0, 1.0, 2.0, 2.0, 3.0, 3.0], "repeat": 0,
                      "e2e_p50": [1.0, 2.0, 1.5, 2.0, 3.0, 2.0], "failed": [0, 0, 0, 0, 0, 0]})
    [c] = stats.crossovers(s, "x", "y", metrics=("e2e_p50",))
    assert (c.leader_before, c.leader_after) == ("x", "y")
    s.loc[5, "failed"] = 40                         # y is only lower at 3 req/s because it failed 40
    assert stats.crossovers(s, "x", "y", metrics=("e2e_p50",)) == []
