import numpy as np
import pandas as pd

from batchlab.report import fmt, verdict
from batchlab.report.capacity import Capacity


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


def test_the_sentence_names_rate_device_model_and_overload():
    c = cmp({20: (0.36, -0.37, -0.40, -0.33)})
    line = verdict.compare_line(c, "dynamic", "naive", 20.0, {"device": "A100-80GB", "model": "Mistral-7B"},
                                {("naive", 20.0), ("dynamic", 5.0)})
    assert line.startswith("Dynamic batching improved throughput by +36%")
    assert "compared to naive batching at 20 req/s on A100-80GB with Mistral-7B" in line
    assert line.endswith("; naive was past capacity there, so its latencies grow with the run's length.")


def test_simulated_runs_say_so_and_pairs_put_the_seed_question_first():
    assert verdict.where({"dtype": "simulated", "device": "7B on A100"}) == " in simulation (7B on A100)"
    caps = {"naive": Capacity("naive", None, False, 5.0), "dynamic": Capacity("dynamic", 5.0, False, 20.0),
            "continuous": Capacity("continuous", 20.0, False, 50.0)}
    assert verdict.ranked_pairs(caps) == [("continuous", "dynamic"), ("continuous", "naive"), ("dynamic", "naive")]
    assert verdict.ranked_pairs({"server": Capacity("server", 5.0, True, None)}) == []


def caps(**rates):
    tried = max(r for r in rates.values() if r is not None) if any(r is not None for r in rates.values()) else None
    return {s: Capacity(s, r, r is not None and r == tried, None) for s, r in rates.items()}


SLO = {"ttft_s": 1.0, "tpot_s": 0.05}


def test_the_headline_names_every_strategys_capacity_and_the_lead():
    c = caps(naive=None, dynamic=5.0, continuous=20.0)
    c = {s: Capacity(s, x.rate, False, None) for s, x in c.items()}              # 50 req/s was tried too
    assert verdict.headline(c, SLO) == ("Continuous sustains 20 req/s within TTFT ≤ 1 s and TPOT ≤ 50 ms; "
                                        "dynamic 5; naive none — 4× more traffic than dynamic.")


def test_the_headline_says_when_the_highest_tried_rate_held_and_when_nothing_did():
    top = verdict.headline(caps(dynamic=5.0, continuous=50.0), SLO)
    assert top.startswith("Continuous sustains ≥ 50 req/s (highest tried) within") and "at least 10× more" in top
    alone = verdict.headline(caps(naive=None, continuous=0.714286), {"e2e_s": 2.5})
    assert alone == ("Continuous sustains ≥ 0.714 req/s (highest tried) within E2E ≤ 2.5 s; naive none — the only "
                     "strategy that sustains any tested rate.")
    none = verdict.headline(caps(naive=None, dynamic=None), SLO)
    assert none.startswith("No strategy sustains even the lowest tested rate within TTFT ≤ 1 s")
    tie = verdict.headline(caps(dynamic=20.0, continuous=20.0), {})
    assert "with no SLO set" in tie and "the same as" in tie and "nan" not in tie


def test_a_burst_run_says_its_rates_carry_the_burst():
    step = {"at_s": 40, "to_rate": 25, "until_s": 50}
    assert " with a burst to 25 req/s from 40 s to 50 s, within" in verdict.headline(caps(continuous=5.0), SLO, step)


def test_the_limits_line_says_what_each_missed_first():
    c = {"continuous": Capacity("continuous", 20.0, False, 50.0, ("TPOT",)),
         "naive": Capacity("naive", None, False, 5.0, ("TTFT", "throughput"))}
    assert verdict.limits_line(c) == "What each misses first: continuous TPOT at 50 req/s; naive TTFT and throughput at 5 req/s."


def test_percentages_round_before_the_sign_and_skip_undefined_ratios():
    assert fmt.change(-0.004) == "+0%" and fmt.change(-0.25) == "−25%"
    assert fmt.change(float("nan")) == "—" and fmt.change(float("inf")) == "—"


FORBIDDEN = ("nan", "inf", "by —")


def clean(lines):
    return all(not any(f in line.lower() for f in FORBIDDEN) for line in lines)


def test_a_strategy_that_failed_every_request_is_named_with_the_recorded_reason(tmp_path):
    # The toy preset holds 28,800 KV tokens: naive's batches of 16 prompts of 8,000 tokens padded
    # to 8,492 never fit, while dynamic backs off to batches that do. Through the CSV files, as
    # the report reads them.
    from batchlab.report import stats
    from batchlab.report.report import load_requests, load_results
    from batchlab.run.config import load_config
    from batchlab.run.sweep import run_sweep
    cfg = load_config(None, ["backend.preset=toy", "strategies=[naive,dynamic]", "traffic.rates=[1]",
                             "traffic.duration_s=40", "traffic.warmup_s=0", "traffic.prompt_len=8000",
                             "traffic.output_len=492", "naive.batch_size=16", "dynamic.max_batch_size=16",
                             "report=false"])
    out = run_sweep(cfg, tmp_path / "r")
    summary, setup, _ = load_results(out)
    assert list(summary["finished"]) == [0, summary["num_requests"].iloc[1]]    # naive none, dynamic all
    lines = verdict.verdict_lines(summary, setup, {("dynamic", "naive"): stats.compare(summary, load_requests(out), "dynamic", "naive")})
    assert "naive" in lines[0] and "sustain" in lines[0]                       # the headline comes first
    assert lines[1] == ("naive failed every request: out of memory — a batch of 16 padded to 8,492 tokens "
                        "needs 135,872 KV tokens, budget 28,800.")
    assert not any(line.startswith("Dynamic batching") for line in lines)    # nothing to compare with
    assert clean(lines)


def failing_cmp(a_failed, b_failed, e2e=(-0.3, -0.35, -0.25), a_value=1.0, b_value=1.5):
    base = {"a": "dynamic", "b": "naive", "a_requests": 600, "b_requests": 600, "a_failed": a_failed,
            "b_failed": b_failed, "a_finished": 600 - a_failed, "b_finished": 600 - b_failed}
    rel, lo, hi = e2e
    note = f"dynamic failed more requests ({a_failed} of 600 vs {b_failed} of 600)" if a_failed > b_failed else ""
    lat = {**row(rel, lo, hi), "a_value": a_value, "b_value": b_value, "note": note}
    lat["supported"] = lat["supported"] and not note
    return pd.DataFrame([{"rate": 20.0, "metric": "throughput_tok_s", **base, **row(0.05, method="one run per strategy"),
                          "a_value": 105.0, "b_value": 100.0, "note": ""},
                         {"rate": 20.0, "metric": "e2e_p50", **base, **lat}])


def test_failure_counts_are_named_and_more_failures_are_never_called_faster():
    line = verdict.compare_line(failing_cmp(12, 0), "dynamic", "naive", 20.0, {})
    assert "reduced p50 E2E latency" not in line
    assert ("showed −30% p50 E2E latency, but dynamic failed more requests (12 of 600 vs 0 of 600), "
            "so it is not called faster") in line
    assert line.endswith("; failed requests: dynamic 12 of 600, naive 0 of 600.")
    fewer = verdict.compare_line(failing_cmp(0, 12), "dynamic", "naive", 20.0, {})
    assert "reduced p50 E2E latency by −30%" in fewer and "failed requests: dynamic 0 of 600, naive 12 of 600" in fewer
    none = verdict.compare_line(failing_cmp(0, 0), "dynamic", "naive", 20.0, {})
    assert "failed" not in none


def test_a_percentile_that_failures_reach_is_said_in_words():
    c = failing_cmp(0, 400, e2e=(np.nan, np.nan, np.nan), b_value=np.inf)
    c["estimate"] = -np.inf
    line = verdict.compare_line(c, "dynamic", "naive", 20.0, {})
    assert "could not compare p50 E2E latency: naive's failed requests reach it" in line and clean([line])


def test_no_sentence_shows_nan_inf_or_a_dash_for_a_number():
    zero_base = row(np.nan, method="one run per strategy")          # b's throughput was 0: no ratio
    assert clean([verdict.claim(pd.Series({**zero_base, "estimate": 50.0, "a_value": 50.0, "b_value": 0.0}),
                                "throughput", "improved", "reduced")])
    assert clean([verdict.claim(pd.Series({**zero_base, "estimate": np.nan}), "throughput", "improved", "reduced")])
    open_ended = row(0.4, 0.1, np.inf)                                # failures reach some replicates
    text = verdict.claim(open_ended, "p50 E2E latency", "raised", "reduced")
    assert text.startswith("raised p50 E2E latency by +40% (95% CI +10% to unbounded") and clean([text])


def test_failure_lines_name_the_rates_unless_it_failed_at_all_of_them():
    s = pd.DataFrame({"strategy": ["naive", "naive", "dynamic", "dynamic"], "rate": [5.0, 20.0, 5.0, 20.0],
                      "num_requests": [100, 400, 100, 400], "finished": [100, 0, 100, 400],
                      "top_error": ["", "out of memory — too big", "", ""]})
    assert verdict.failure_lines(s) == ["naive failed every request at 20 req/s: out of memory — too big."]
    s["finished"] = [0, 0, 100, 400]
    assert verdict.failure_lines(s) == ["naive failed every request: out of memory — too big."]
    assert verdict.failure_lines(s.drop(columns="top_error"))[0].endswith("no reason recorded (see requests.csv).")


def test_points_too_short_for_a_growing_queue_carry_a_caveat():
    assert "may be overstated" in verdict.short_line(12.0) and "12 s" in verdict.short_line(12.0)
    assert verdict.short_line(60.0) is None and verdict.short_line(None) is None
