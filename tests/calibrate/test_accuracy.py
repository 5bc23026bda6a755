import math

import numpy as np
import pandas as pd
import pytest

from batchlab.calibrate import accuracy


def table(real, real_b, sim, spread=0.0, metric="e2e_p50"):
    n = len(real)
    sim = np.asarray(sim, dtype=float)
    return pd.DataFrame({"kind": "latency", "workload": "base", "strategy": "continuous", "rate": np.arange(n),
                         "repeat": 0, "metric": metric, "real": real, "real_b": real_b, "sim": sim,
                         "sim_lo": sim * (1 - spread), "sim_hi": sim * (1 + spread)})


def test_cells_line_up_every_side_by_key():
    real = pd.DataFrame({"strategy": ["a", "b"], "rate": [1.0, 1.0], "repeat": [0, 0], "x": [1.0, 2.0]})
    shifted = real.assign(x=real["x"] * 2)
    t = accuracy.cells(real, shifted, {"sim": shifted[::-1], "sim_lo": real, "sim_hi": real},
                       ["strategy", "rate", "repeat"], ("x",), "latency")
    assert list(t["sim"]) == [2.0, 4.0]          # matched by key, not by row order
    assert list(t["real_b"]) == [2.0, 4.0] and list(t["kind"]) == ["latency", "latency"]


def test_errors_and_noise_are_relative_to_the_first_run():
    t = accuracy.with_errors(table([1.0, 2.0], [1.1, 1.8], [1.2, 2.0]))
    assert list(t["error"]) == pytest.approx([0.2, 0.0])
    assert list(t["noise"]) == pytest.approx([0.1, -0.1])


def test_the_interval_adds_the_model_and_run_spreads_in_quadrature():
    # noise +-10 % on every cell: one run's sigma is 0.1 / sqrt(2); the model spread is 5 % of sim
    t = accuracy.with_errors(table([1.0, 1.0], [1.1, 0.9], [1.0, 2.0], spread=0.05))
    run = 0.1 / math.sqrt(2)
    half = accuracy.Z90 * np.sqrt((0.05 * t["sim"]) ** 2 + (run * t["sim"]) ** 2)
    assert list(t["hi"] - t["sim"]) == pytest.approx(list(half))
    assert list(t["inside"]) == [True, False]


def test_intervals_cover_about_90_percent_when_the_noise_is_what_they_assume():
    # a perfect simulator (the true mean) against runs with 8 % normal noise: the pooled floor
    # gives the interval its width, and it should hold ~90 % of first runs
    rng = np.random.default_rng(0)
    n = 4000
    truth = rng.uniform(0.01, 1.0, n)
    a, b = (truth * (1 + 0.08 * rng.standard_normal(n)) for _ in range(2))
    t = accuracy.with_errors(table(a, b, truth))
    assert 0.87 <= t["inside"].mean() <= 0.93


def test_summary_medians_p90_and_coverage_per_metric():
    t = accuracy.with_errors(pd.concat([table([1.0] * 10, [1.0] * 10, 1 + np.arange(10) / 100),
                                        table([1.0] * 4, [1.0] * 4, [2.0] * 4, metric="ttft_p99")]))
    s = accuracy.summary(t).set_index("metric")
    assert s.loc["e2e_p50", "error_median"] == pytest.approx(0.045)
    assert s.loc["e2e_p50", "error_p90"] == pytest.approx(0.081)
    assert s.loc["e2e_p50", "met"] == "yes" and s.loc["ttft_p99", "met"] == ""
    assert s.loc["ttft_p99", "coverage"] == 0.0 and s.loc["e2e_p50", "cells"] == 10


@pytest.mark.parametrize(("err", "noise", "met"), [
    ((0.05, 0.09), (0.01, 0.02), "yes"),                       # inside the targets
    ((0.08, 0.09), (0.01, 0.02), "no"),                        # median over 6 % with a quiet machine
    ((0.08, 0.09), (0.07, 0.08), "within 1.5x floor"),         # the machine itself differs by 7 %
    ((0.12, 0.09), (0.07, 0.08), "no"),                        # more than 1.5x that floor
    ((0.05, 0.20), (0.02, 0.15), "within 1.5x floor"),         # P90 over 10 %, but so is the floor's
])
def test_targets_fall_back_to_the_noise_floor_only_where_the_floor_is_larger(err, noise, met):
    row = {"error_median": err[0], "error_p90": err[1], "noise_median": noise[0], "noise_p90": noise[1]}
    assert accuracy.verdict("e2e_p50", row)["met"] == met


@pytest.mark.parametrize(("metric", "err", "noise", "met"), [
    ("e2e_p50", 0.065, 0.01, "yes"),       # within 7 % on a quiet machine
    ("e2e_p50", 0.08, 0.01, "no"),
    ("e2e_p50", 0.08, 0.058, "yes"),       # 1.5x a 5.8 % floor is 8.7 %: an engine's rule says no here
    ("ttft_p50", 0.14, 0.02, "yes"),       # TTFT's bound is 15 %
    ("tpot_p50", 0.12, float("nan"), "no"),   # no floor excuses nothing
    ("ttft_p99", 0.50, 0.01, ""),          # reported against the floor alone
])
def test_a_server_twin_is_judged_within_its_bound_or_one_and_a_half_floors(metric, err, noise, met):
    row = {"error_median": err, "error_p90": err, "noise_median": noise, "noise_p90": noise}
    got = accuracy.twin_verdict(metric, row)
    assert got["met"] == met
    if noise == 0.058:
        assert accuracy.verdict(metric, row)["met"] == "no" and got["target"] == "median <= max(7%, 1.5x floor) = 8.7%"


def test_a_validation_of_a_server_twin_is_summarised_against_the_twin_targets():
    t = accuracy.with_errors(table([1.0] * 4, [1.05] * 4, [1.074] * 4))     # floor 5 %, error 7.4 %
    assert accuracy.summary(t, twin=True).loc[0, "met"] == "yes" and accuracy.summary(t).loc[0, "met"] == "no"


def test_no_rerun_means_no_floor_and_a_model_only_interval():
    t = accuracy.with_errors(table([1.0, 1.0], [np.nan, np.nan], [1.05, 1.2], spread=0.05))
    assert t["noise"].isna().all()
    assert list(t["inside"]) == [True, False]
    s = accuracy.summary(t)
    assert math.isnan(s.loc[0, "noise_median"]) and s.loc[0, "met"] == "no"    # no floor excuses nothing


def test_sides_counts_the_cells_below_and_above_the_real_run_per_latency_metric():
    import pandas as pd

    from batchlab.calibrate.accuracy import sides
    t = pd.DataFrame({"kind": ["latency"] * 4 + ["saturation"], "metric": ["e2e_p50"] * 3 + ["tpot_p50", "throughput_tok_s"],
                      "real": [1.0, 1.0, 1.0, 2.0, 5.0], "sim": [0.9, 0.8, 1.1, 2.0, 1.0]})
    got = sides(t)
    assert got["e2e_p50"] == {"below": 2 / 3, "above": 1 / 3, "cells": 3}
    assert got["tpot_p50"] == {"below": 0.0, "above": 0.0, "cells": 1}    # equal reads as neither side
    assert "throughput_tok_s" not in got


def test_by_workload_gives_each_workloads_signed_median_error_per_latency_metric():
    t = pd.concat([table([1.0, 1.0, 1.0], [1.0] * 3, [0.8, 0.9, 0.7]).assign(workload="short"),
                   table([1.0, 1.0], [1.0] * 2, [1.1, 1.3]).assign(workload="long"),
                   table([2.0], [2.0], [1.0], metric="tpot_p50").assign(workload="long")], ignore_index=True)
    t = pd.concat([accuracy.with_errors(t), pd.DataFrame({"kind": ["saturation"], "workload": ["short"],
                                                          "metric": ["throughput_tok_s"], "error": [0.5]})])
    got = accuracy.by_workload(t)
    assert got["short"] == {"e2e_p50": {"median_error": pytest.approx(-0.2), "cells": 3}}     # low, not cancelled
    assert got["long"]["e2e_p50"] == {"median_error": pytest.approx(0.2), "cells": 2}
    assert got["long"]["tpot_p50"]["median_error"] == pytest.approx(-0.5)


@pytest.mark.parametrize("dof, table_value", [(1, 6.3138), (2, 2.9200), (3, 2.3534), (9, 1.8331), (30, 1.6973)])
def test_t_quantile_matches_the_printed_table(dof, table_value):
    assert accuracy.t_quantile(0.95, dof) == pytest.approx(table_value, rel=1e-3)


def test_t_quantile_refuses_no_degrees_of_freedom():
    with pytest.raises(ValueError, match="at least 1"):
        accuracy.t_quantile(0.95, 0)


def two_workloads(errors_a, errors_b):
    """Cells of workloads a and b (real 1.0, replay 1 + error), step-cost spread 5 %."""
    parts = [table([1.0] * len(e), [1.0] * len(e), 1 + np.asarray(e), spread=0.05).assign(workload=w)
             for w, e in (("a", errors_a), ("b", errors_b))]
    return pd.concat(parts, ignore_index=True)


def test_a_held_out_interval_is_as_wide_as_the_other_workloads_errors():
    t = accuracy.with_errors(two_workloads([0.1, -0.1, 0.1], [0.0, 0.02]), rule="held-out")
    a, b = t[t["workload"] == "a"], t[t["workload"] == "b"]
    # a's bound from b's two errors (rms sqrt(0.0002)), b's from a's three (rms 0.1): no cell sizes its own
    qa, qb = accuracy.t_quantile(0.95, 2) * math.sqrt(0.0002), accuracy.t_quantile(0.95, 3) * 0.1
    assert list(a["lo"]) == pytest.approx(list(a["sim"] / (1 + qa))) and list(a["hi"]) == pytest.approx(list(a["sim"] / (1 - qa)))
    assert list(b["lo"]) == pytest.approx(list(b["sim"] / (1 + qb))) and list(b["hi"]) == pytest.approx(list(b["sim"] / (1 - qb)))
    assert not a["inside"].any() and b["inside"].all()


def test_a_held_out_interval_holds_the_real_value_exactly_when_the_error_is_within_its_bound():
    # b's bound from a's errors: q = t(0.95, 2) x 0.2 = 0.58, so b's +-55 % are both inside (an
    # interval sim +- q sim would leave the replay 55 % below out); a's bound from b's, q > 1: no upper end
    t = accuracy.with_errors(two_workloads([0.2, -0.2], [0.55, -0.55]), rule="held-out")
    a, b = t[t["workload"] == "a"], t[t["workload"] == "b"]
    assert accuracy.t_quantile(0.95, 2) * 0.2 > 0.55 and b["inside"].all()
    assert np.isinf(a["hi"]).all() and a["inside"].all()


def test_a_held_out_interval_with_no_other_workload_is_the_step_cost_one():
    one = table([1.0, 1.0], [1.1, 0.9], [1.0, 2.0], spread=0.05)
    held, step = accuracy.with_errors(one, rule="held-out"), accuracy.with_errors(one)
    assert list(held["hi"]) == pytest.approx(list(step["hi"])) and list(held["inside"]) == list(step["inside"])


def test_held_out_intervals_cover_about_90_percent_when_every_workload_errs_alike():
    # eight workloads whose replays miss by the same 8 % normal error: the interval each reads from
    # the other seven should hold ~90 % of its cells, and the other metric's cells do not mix in
    rng = np.random.default_rng(1)
    parts = [table([1.0] * 100, [1.0] * 100, 1 + s * rng.standard_normal(100), metric=m).assign(workload=w)
             for w in "abcdefgh" for m, s in (("e2e_p50", 0.08), ("ttft_p99", 0.5))]
    t = accuracy.with_errors(pd.concat(parts, ignore_index=True), rule="held-out")
    assert 0.87 <= t["inside"].mean() <= 0.93
    e2e = t[t["metric"] == "e2e_p50"]
    assert ((e2e["hi"] - e2e["sim"]) / e2e["sim"]).max() < 0.2      # not widened by ttft_p99's 50 %


def test_an_unknown_interval_rule_is_refused():
    with pytest.raises(ValueError, match="interval rule 'wide'"):
        accuracy.with_errors(table([1.0], [1.0], [1.0]), rule="wide")
