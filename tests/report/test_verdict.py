import numpy as np
import pandas as pd

from batchlab.report import verdict


def row(rel, low=np.nan, high=np.nan, method="paired block bootstrap over 500 requests of one trace", **kw):
    supported = bool(np.isfinite(low) and (low > 0 or high < 0))
    return pd.Series({"estimate": rel, "rel": rel, "low": low, "high": high, "rel_low": low, "rel_high": high,
                      "method": method, "supported": supported, **kw})


def test_a_supported_change_is_claimed_with_its_interval():
    text = verdict.claim(row(-0.37, -0.40, -0.33), "p50 E2E latency", "raised", "reduced")
    assert text.startswith("reduced p50 E2E latency by −37% (95% CI −40% to −33%")


def test_an_interval_that_includes_zero_is_no_measurable_difference():
    text = verdict.claim(row(0.05, -0.02, 0.12), "p50 E2E latency", "raised", "reduced")
    assert text.startswith("showed no measurable difference in p50 E2E latency (+5%")


def test_a_number_without_an_interval_says_so_and_small_ones_are_about_the_same():
    big = verdict.claim(row(0.36, method="one run per strategy"), "throughput", "improved", "reduced")
    assert big == "improved throughput by +36% (one run per strategy: no interval)"
    small = verdict.claim(row(0.01, method="one run per strategy"), "throughput", "improved", "reduced")
    assert small.startswith("left throughput about the same (+1%")


def cmp(rates_rel):
    rows = []
    for rate, (thr, lat, lo, hi) in rates_rel.items():
        rows.append({"rate": rate, "metric": "throughput_tok_s", **row(thr, method="one run per strategy")})
        rows.append({"rate": rate, "metric": "e2e_p50", **row(lat, lo, hi)})
    return pd.DataFrame(rows)


def test_headline_rate_is_the_largest_supported_latency_gain():
    c = cmp({5: (0.0, -0.30, -0.35, -0.25), 20: (0.3, -0.60, -0.9, 0.1), 50: (0.3, -0.40, -0.45, -0.35)})
    assert verdict.headline_rate(c) == 50        # 20 req/s has a bigger gain, but its interval includes 0


def test_the_sentence_names_rate_device_model_and_overload():
    c = cmp({20: (0.36, -0.37, -0.40, -0.33)})
    line = verdict.compare_line(c, "dynamic", "naive", 20.0, {"device": "A100-80GB", "model": "Mistral-7B"},
                                {("naive", 20.0), ("dynamic", 5.0)})
    assert line.startswith("Dynamic batching improved throughput by +36%")
    assert "compared to naive batching at 20 req/s on A100-80GB with Mistral-7B" in line
    assert line.endswith("; naive was past capacity there, so its latencies grow with the run's length.")


def test_simulated_runs_say_so_and_pairs_put_the_seed_question_first():
    assert verdict.where({"dtype": "simulated", "device": "7B on A100"}) == " in simulation (7B on A100)"
    assert verdict.pairs(["naive", "continuous", "dynamic"])[0] == ("dynamic", "naive")
    assert verdict.pairs(["server"]) == []


def test_knee_line_names_every_strategy_and_needs_an_slo():
    s = pd.DataFrame({"strategy": ["a", "a", "b"], "rate": [5.0, 20.0, 5.0], "slo_attainment": [1.0, 0.95, 0.1]})
    line = verdict.knee_line(s, {"ttft_s": 1.0})
    assert "a 20 req/s" in line and "b none of the tested rates" in line and "TTFT ≤ 1 s" in line
    assert verdict.knee_line(s, {}) is None


def test_percentages_round_before_the_sign_and_skip_undefined_ratios():
    assert verdict.pct(-0.004) == "+0%" and verdict.pct(-0.25) == "−25%"
    assert verdict.pct(float("nan")) == "—" and verdict.pct(float("inf")) == "—"
