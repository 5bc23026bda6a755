"""The front end's engine time, priced from what arrivals cost running streams."""
from dataclasses import replace

import pytest

from batchlab.backends.presets import load_cost
from batchlab.calibrate.front_end import ArrivalProbe, arrival_costs, bare, fit_line, front_end, with_front_end
from batchlab.calibrate.twin_check import Twin
from batchlab.run.config import load_config

PROBE = ArrivalProbe(prompts=(32, 128, 384), streams=(8, 32, 200), rounds=2)


def test_the_line_through_the_excess_is_least_squares_and_never_below_zero():
    assert fit_line({32: 0.002, 384: 0.009}) == pytest.approx((0.002 - 32 * 0.007 / 352, 0.007 / 352))
    assert fit_line({32: 0.004, 384: 0.002}) == pytest.approx((0.003, 0.0))      # falling: no per-token part
    level, slope = fit_line({100: 0.001, 200: 0.003})                             # the line would cross below zero
    assert level == 0.0 and slope == pytest.approx((100 * 0.001 + 200 * 0.003) / (100 ** 2 + 200 ** 2))
    assert fit_line({64: -0.001}) == (0.0, 0.0)


@pytest.mark.parametrize("engine_s, per_token", [(0.0, 0.0), (0.002, 0.0), (0.0005, 3e-5)])
def test_a_server_whose_front_end_takes_engine_time_is_priced_back_from_its_arrivals(engine_s, per_token):
    # the "server" is a twin with a known front end on its engine; the probe, on it and on the
    # same step model without any front end, must give that front end back
    cfg = load_config(None, ["strategies=[continuous]", "continuous.max_num_seqs=64"])
    steps = replace(load_cost("toy"), kv_budget_bytes=1 << 40)
    known = replace(steps, frontend_on_engine=True, frontend_s=engine_s, frontend_s_per_token=per_token)
    server = Twin(cfg, cost=known).replay
    measured = arrival_costs(server, PROBE)            # virtual time: every round alike
    fe = front_end(measured, Twin(cfg, cost=bare(known)).replay, before_s=0.004, probe=PROBE)
    # the streams pay every second of it: the front end runs while they decode
    assert fe.engine_s == pytest.approx(engine_s, abs=1e-9) and fe.engine_s_per_token == pytest.approx(per_token, abs=1e-12)
    priced = with_front_end(steps, fe)
    assert priced.frontend_on_engine and priced.first_token_s == pytest.approx(max(0.0, 0.004 - fe.engine_s))
