import numpy as np
import pandas as pd
import pytest

from batchlab.report import timeline as tl


def test_occupancy_counts_overlaps_and_leaves_before_entering_at_equal_times():
    t, n = tl.occupancy([0, 1, 2], [2, 3, np.nan])
    assert tl.peak(t, n) == 2                      # at t=2 one leaves as one enters: never 3
    assert list(n)[-1] == 1                        # the open-ended one is still in


def test_an_empty_interval_never_counts_and_never_goes_negative():
    t, n = tl.occupancy([0, 1, 1], [2, 1, 3])      # the second is admitted the moment it arrives
    assert n.min() >= 0 and tl.peak(t, n) == 2


def test_peak_includes_the_level_carried_into_the_window():
    t, n = tl.occupancy([0, 0, 0], [10, 10, 10])
    assert tl.peak(t, n, 5, 8) == 3


def test_useful_decode_work_matches_the_seed_example():
    # outputs of 50, 120, 500 and 80 tokens in one lockstep batch: 750 / (4 x 500) = 37.5%
    rows = pd.DataFrame({"strategy": "naive", "rate": 1.0, "repeat": 0, "scheduled_time": 1.0, "status": "finished",
                         "trigger": "size", "output_len": [50, 120, 500, 80], "prompt_len": [10, 10, 10, 10]})
    b = tl.batches(rows)
    assert b["useful_decode"].iloc[0] == pytest.approx(0.375)
    assert b["prompt_fill"].iloc[0] == 1.0
    active = tl.rows_still_decoding([50, 120, 500, 80])
    assert (active[0], active[50], active[499], len(active)) == (4, 3, 1, 500)
    assert active.sum() == 750


def test_continuous_rows_are_not_batches():
    rows = pd.DataFrame({"strategy": "continuous", "rate": 1.0, "repeat": 0, "scheduled_time": 1.0,
                         "status": "finished", "trigger": np.nan, "output_len": [5, 9], "prompt_len": [3, 3]})
    assert tl.batches(rows).empty


def test_lockstep_rows_hold_their_slot_until_the_batch_ends():
    rows = pd.DataFrame({"scheduled_time": [0.0, 0.0], "completion_time": [1.0, 5.0], "trigger": "size"})
    t, n = tl.running(rows)
    assert list(zip(t, n)) == [(0, 1), (0, 2), (5, 1), (5, 0)]


def burst_rows(recover_at: float, base: float = 0.1, high: float = 5.0) -> pd.DataFrame:
    """One request per 0.1 s from 0 to 100 s; TTFT `high` from the burst (40 s) until recover_at."""
    t = np.arange(0, 100, 0.1)
    ttft = np.where((t >= 40) & (t < recover_at), high, base)
    return pd.DataFrame({"strategy": "x", "rate": 10.0, "arrival_time": t, "scheduled_time": t + ttft / 2,
                         "completion_time": t + ttft + 1, "ttft": ttft, "tpot": 0.01, "e2e": ttft + 1,
                         "status": "finished"})


def test_burst_recovery_and_slo_violation_seconds():
    # windows of 2 s from the warm-up's end (4 s) line up with the burst; otherwise +-1 window
    r = tl.burst(burst_rows(70.0), warmup_s=4, at_s=40, until_s=50, end_s=100, slo={"ttft_s": 1.0})
    assert r.window_s == 2.0
    assert r.recovery_s == pytest.approx(20.0)       # back to baseline at 70 s, 20 s after the burst ended
    assert r.violating_s == pytest.approx(30.0)       # 40..70 s above the 1 s TTFT SLO
    assert r.baseline_p99_ttft == pytest.approx(0.1)


def test_a_run_that_never_recovers_says_so():
    r = tl.burst(burst_rows(1e9), warmup_s=5, at_s=40, until_s=50, end_s=100, slo=None)
    assert r.recovery_s is None and r.violating_s is None


# Runs where requests failed or nothing arrived (issue #11): numbers or None, never a warning.

@pytest.mark.filterwarnings("error")
def test_a_percentile_that_reaches_a_failed_request_is_inf_and_otherwise_numpys():
    assert tl.percentile(np.array([1.0, 2.0, np.inf]), 99) == np.inf      # numpy: NaN and a RuntimeWarning
    assert tl.percentile(np.array([np.inf, np.inf]), 99) == np.inf
    with_one_failure = np.r_[np.arange(200.0), np.inf]                   # p99 lands on a finished request
    assert tl.percentile(with_one_failure, 99) == 198.0
    v = np.random.default_rng(0).exponential(size=57)
    assert tl.percentile(v, 99) == np.percentile(v, 99)
    assert np.isnan(tl.percentile(np.array([]), 99))


def test_a_request_rejected_before_it_was_scheduled_never_waits_in_the_queue():
    rows = pd.DataFrame({"arrival_time": [0.0, 1.0], "scheduled_time": [2.0, np.nan],
                         "completion_time": [3.0, np.nan], "status": ["finished", "failed"]})
    t, n = tl.queue_depth(rows)
    assert tl.peak(t, n) == 1 and n[-1] == 0


def test_a_batch_that_ran_out_of_memory_holds_no_slot_after_it_failed():
    rows = pd.DataFrame({"scheduled_time": [1.0, 1.0, 4.0], "first_token_time": [np.nan, np.nan, 4.5],
                         "completion_time": [np.nan, np.nan, 5.0], "trigger": "size",
                         "status": ["failed", "failed", "finished"]})
    t, n = tl.running(rows)
    assert tl.peak(t, n) == 1 and n[-1] == 0


def test_a_request_still_unfinished_at_the_end_keeps_its_slot():
    rows = pd.DataFrame({"scheduled_time": [1.0], "completion_time": [np.nan], "trigger": [np.nan],
                         "status": ["unfinished"]})
    t, n = tl.running(rows)
    assert n[-1] == 1


@pytest.mark.filterwarnings("error")
def test_burst_of_a_run_where_every_request_failed_has_no_baseline_and_no_recovery():
    rows = burst_rows(70.0).assign(status="failed", ttft=np.nan, scheduled_time=np.nan, completion_time=np.nan)
    r = tl.burst(rows, warmup_s=4, at_s=40, until_s=50, end_s=100, slo={"ttft_s": 1.0})
    assert np.isnan(r.baseline_p99_ttft) and r.recovery_s is None
    assert r.violating_s == pytest.approx(96.0)                      # every window from 4 s to 100 s misses the SLO
    assert r.peak_queue == 0                                         # rejected requests do not pile up


@pytest.mark.filterwarnings("error")
def test_no_end_no_windows_and_a_rate_of_zero_gets_one_second_windows():
    edges, vals = tl.windowed(burst_rows(70.0), 0.0, float("nan"), 1.0, tl.p99_ttft)
    assert len(edges) == len(vals) == 0
    assert tl.window_for(0.0) == 1.0 and tl.window_for(2.0) == 10.0
    assert len(tl.rows_still_decoding([])) == 0
