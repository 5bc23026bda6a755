import json
import math

import pytest

from batchlab.calibrate import live


def test_the_factor_is_the_median_ratio_with_the_medians_standard_error():
    lv = live.estimate([math.log(1.1), math.log(1.2), math.log(1.3), float("nan")])
    assert lv.factor == pytest.approx(1.2) and lv.cells == 3
    mad = min(abs(math.log(x) - math.log(1.2)) for x in (1.1, 1.3))     # median of |log x - log 1.2|: 0, and these two
    assert lv.se == pytest.approx(live.SE_OF_MEDIAN * live.MAD_TO_SD * mad / math.sqrt(3))
    # one far value moves the standard error as one more value, not by its square (from the standard
    # deviation it would be 1.25 x sd / 2 = 1.2 here)
    wild = live.estimate([math.log(1.1), math.log(1.2), math.log(1.3), math.log(50.0)])
    assert wild.se < 0.1
    assert live.estimate([]) == live.NONE and live.estimate([float("nan")]) == live.NONE
    assert live.estimate([0.5]).se == 0.0


def test_a_workloads_factor_never_reads_its_own_cells():
    log = math.log
    ratios = {"a": {"iteration": [log(2.0)] * 3}, "b": {"iteration": [log(1.1)] * 3, "request": [log(1.5)]},
              "c": {"iteration": [log(1.3)] * 3}}
    out = live.leave_one_out(ratios)
    assert out["a"]["iteration"].factor == pytest.approx(1.2, rel=0.1)         # b and c only: 1.1 and 1.3
    assert out["a"]["iteration"].factor != pytest.approx(2.0)
    assert out["b"]["request"] == live.NONE                                    # the only request-level cells are b's
    assert out["a"]["request"].factor == pytest.approx(1.5)
    assert live.pooled(ratios)["iteration"].cells == 9


def test_a_missing_or_nonpositive_tpot_gives_no_ratio():
    assert math.isnan(live.log_ratio(float("nan"), 1.0))
    assert math.isnan(live.log_ratio(0.0, 1.0)) and math.isnan(live.log_ratio(1.0, 0.0))
    assert live.log_ratio(2.0, 1.0) == pytest.approx(math.log(2.0))


def test_the_live_profile_scales_every_step_time_and_the_shape_knots(tmp_path):
    from dataclasses import replace

    from batchlab.backends.presets import load_cost
    src = tmp_path / "p.json"
    toy = replace(load_cost("toy"), shape_s=((1.0, 0.001), (32.0, -0.002)))
    toy.to_json(src, fit_rms_rel_error=0.1, level="iteration")
    live.write_live_profile(str(src), tmp_path / "live.json", live.Live(1.25, 0.03, 12), live.Live(0.8, 0.05, 10))
    out = json.loads((tmp_path / "live.json").read_text())
    assert out["overhead_s"] == pytest.approx(1.25 * toy.overhead_s)
    assert out["decode_s_per_row"] == pytest.approx(1.25 * toy.decode_s_per_row)
    assert out["kv_bytes_per_token"] == toy.kv_bytes_per_token and out["kv_budget_bytes"] == toy.kv_budget_bytes
    assert out["fit_rms_rel_error"] == 0.1 and out["level"] == "iteration"    # what the profile holds besides: kept
    assert out["shape_s"] == [[1, pytest.approx(0.00125)], [32, pytest.approx(-0.0025)]]
    assert out["live_factor"]["factor"] == 1.25 and out["live_factor"]["cells"] == 12
    assert out["prefill_s_per_token"] == pytest.approx(1.25 * 0.8 * toy.prefill_s_per_token)   # first-token terms: both
    assert out["first_token_factor"]["factor"] == 0.8 and out["first_token_factor"]["cells"] == 10


def test_a_cells_first_token_factor_is_its_ttft_error_over_the_share_those_terms_carry():
    import math
    # replayed TTFT 100 ms at 1x, 130 ms at PROBE x: ds = log(1.3) / log(PROBE) of it moves with them;
    # the real 120 ms is then log(1.2) / ds in log factor away
    u = live.log_correction(0.120, 0.100, 0.130)
    assert u == pytest.approx(math.log(1.2) * math.log(live.PROBE) / math.log(1.3))
    assert live.log_correction(0.080, 0.100, 0.130) < 0                     # real faster: a factor below 1
    # a cell whose TTFT those terms barely move (queueing sets it) cannot say anything
    tiny = math.exp(0.5 * live.MIN_SHARE * math.log(live.PROBE))
    assert math.isnan(live.log_correction(0.120, 0.100, 0.100 * tiny))
    assert math.isnan(live.log_correction(float("nan"), 0.100, 0.130))


def test_the_first_token_delay_is_the_median_seconds_with_its_standard_error():
    d = live.estimate_delay([0.004, 0.006, 0.005, float("nan")])
    assert d.seconds == pytest.approx(0.005) and d.cells == 3
    assert d.se == pytest.approx(live.SE_OF_MEDIAN * live.MAD_TO_SD * 0.001 / math.sqrt(3))
    assert live.estimate_delay([-0.003, -0.001]).seconds == pytest.approx(-0.002)   # first tokens came early
    assert live.estimate_delay([]) == live.NO_DELAY
    out = live.leave_one_out({"a": {"iteration": [0.1]}, "b": {"iteration": [0.002]}}, live.estimate_delay)
    assert out["a"]["iteration"].seconds == pytest.approx(0.002)


def test_a_cells_first_token_delay_is_its_ttft_miss_over_how_much_a_delay_moves_it():
    # a delay moves this cell's TTFT one for one: the miss is the delay
    assert live.first_token_delay(0.120, 0.100, 0.100 + live.DELAY_PROBE_S) == pytest.approx(0.020)
    # queueing doubles what a delay does to it: half the miss
    assert live.first_token_delay(0.120, 0.100, 0.100 + 2 * live.DELAY_PROBE_S) == pytest.approx(0.010)
    assert math.isnan(live.first_token_delay(0.120, 0.100, 0.100 + 0.01 * live.DELAY_PROBE_S))
    assert math.isnan(live.first_token_delay(float("nan"), 0.100, 0.110))


def test_the_live_profile_carries_a_first_token_delay_beside_its_factor(tmp_path):
    from batchlab.backends.cost import StepCost
    from batchlab.backends.presets import load_cost
    src, dst = tmp_path / "p.json", tmp_path / "live.json"
    load_cost("toy").to_json(src, level="any")
    live.write_live_profile(str(src), dst, live.Live(1.25, 0.02, 10), live.Delay(0.004, 0.001, 8))
    cost, out = StepCost.from_json(dst), json.loads(dst.read_text())
    assert cost.first_token_s == pytest.approx(0.004) and cost.arrival_delay_s == pytest.approx(0.004)
    assert cost.prefill_s_per_token == pytest.approx(1.25 * load_cost("toy").prefill_s_per_token)   # the factor alone
    assert out["first_token_delay"] == {"seconds": 0.004, "se": 0.001, "cells": 8, "metric": live.FIRST_METRIC}


def test_a_correction_within_the_gates_standard_errors_of_none_is_not_applied_but_keeps_its_error():
    lv = live.Live(1.05, 0.02, 12)                           # log 1.05 = 0.049: 2.4 standard errors from none
    assert live.distinct(lv, 2.0) and live.gated(lv, 2.0) is lv
    assert not live.distinct(lv, 3.0)
    assert live.gated(lv, 3.0) == live.Live(1.0, 0.02, 12)    # none, its standard error and cells kept
    slow = live.Live(1 / 1.05, 0.02, 12)                     # the same distance below: the same verdict
    assert live.distinct(slow, 2.0) and not live.distinct(slow, 3.0)
    delay = live.Delay(-0.003, 0.0016, 18)                   # 1.9 standard errors
    assert live.gated(delay, 2.0) == live.Delay(0.0, 0.0016, 18) and live.gated(delay, 1.5) is delay
    # gate 0 applies everything; with no standard error (one cell) there is nothing to judge by
    assert live.gated(live.Live(1.001, 0.02, 3), 0.0).factor == 1.001
    assert live.gated(live.Live(1.001, 0.0, 1), 5.0).factor == 1.001


def test_the_gate_applies_to_every_workloads_and_levels_estimate():
    per = {"a": {"iteration": live.Live(1.3, 0.02, 8)}, "b": {"iteration": live.Live(1.01, 0.02, 8)}}
    out = live.gated_all(per, 2.0)
    assert out["a"]["iteration"].factor == 1.3 and out["b"]["iteration"].factor == 1.0


def test_counted_over_workloads_the_standard_error_is_the_spread_of_their_medians():
    log = math.log
    # two workloads near 1.0, two near 1.25, each tight: the cells call the factor sure, the workloads do not
    ratios = {"base": {"server": [log(0.99), log(1.0), log(1.01)]}, "bursty": {"server": [log(1.0), log(1.01), log(1.02)]},
              "long": {"server": [log(1.24), log(1.25), log(1.26)]}, "longer": {"server": [log(1.25), log(1.26), log(1.27)]}}
    by_cells = live.leave_one_out(ratios)["base"]["server"]
    by_workloads = live.leave_one_out(ratios, units="workloads")["base"]["server"]
    assert by_workloads.factor == by_cells.factor and by_workloads.cells == by_cells.cells == 9
    meds = [log(1.01), log(1.25), log(1.26)]                 # bursty, long and longer: base's own cells never count
    mean = sum(meds) / 3
    sd = math.sqrt(sum((m - mean) ** 2 for m in meds) / 2)
    assert by_workloads.se == pytest.approx(sd / math.sqrt(3))
    assert by_workloads.se > 3 * by_cells.se
    assert by_workloads.se == pytest.approx(live.between_se([ratios[w]["server"] for w in ("bursty", "long", "longer")]))
    everyone = [log(m) for m in (1.0, 1.01, 1.25, 1.26)]
    mean = sum(everyone) / 4
    sd = math.sqrt(sum((m - mean) ** 2 for m in everyone) / 3)
    assert live.pooled(ratios, units="workloads")["server"].se == pytest.approx(sd / 2)


def test_workloads_that_agree_keep_the_cells_standard_error():
    # the same median everywhere: no spread between workloads, so the cells' error is the larger
    ratios = {w: {"server": [-0.01, 0.0, 0.01, 0.3]} for w in ("a", "b", "c")}
    assert live.leave_one_out(ratios, units="workloads") == live.leave_one_out(ratios)
    assert live.between_se([[0.1, float("nan")], [float("nan")], []]) == 0.0   # one workload with values: nothing to spread
    # a delay (seconds) the same way: workloads a and b, tight at 10 and 30 ms, give c's
    delay = live.leave_one_out({"a": {"s": [0.0099, 0.01, 0.0101]}, "b": {"s": [0.0299, 0.03, 0.0301]},
                                "c": {"s": [0.02]}}, live.estimate_delay, "workloads")["c"]["s"]
    assert delay.seconds == pytest.approx(0.02, abs=1e-4) and delay.se == pytest.approx(0.01)   # sd 0.0141 / sqrt 2
