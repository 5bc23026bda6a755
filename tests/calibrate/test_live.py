import json
import math

import pytest

from batchlab.calibrate import live


def test_the_factor_is_the_median_ratio_with_the_medians_standard_error():
    lv = live.estimate([math.log(1.1), math.log(1.2), math.log(1.3), float("nan")])
    assert lv.factor == pytest.approx(1.2) and lv.cells == 3
    mean = sum(math.log(x) for x in (1.1, 1.2, 1.3)) / 3
    sd = math.sqrt(sum((math.log(x) - mean) ** 2 for x in (1.1, 1.2, 1.3)) / 2)
    assert lv.se == pytest.approx(live.SE_OF_MEDIAN * sd / math.sqrt(3))
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
    live.write_live_profile(str(src), tmp_path / "live.json", live.Live(1.25, 0.03, 12))
    out = json.loads((tmp_path / "live.json").read_text())
    assert out["overhead_s"] == pytest.approx(1.25 * toy.overhead_s)
    assert out["decode_s_per_row"] == pytest.approx(1.25 * toy.decode_s_per_row)
    assert out["kv_bytes_per_token"] == toy.kv_bytes_per_token and out["kv_budget_bytes"] == toy.kv_budget_bytes
    assert out["fit_rms_rel_error"] == 0.1 and out["level"] == "iteration"    # what the profile holds besides: kept
    assert out["shape_s"] == [[1, pytest.approx(0.00125)], [32, pytest.approx(-0.0025)]]
    assert out["live_factor"]["factor"] == 1.25 and out["live_factor"]["cells"] == 12
