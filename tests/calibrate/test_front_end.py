"""The front end's engine time, priced from what arrivals cost running streams."""
from dataclasses import replace

import pytest

from batchlab.backends.presets import load_cost
from batchlab.calibrate.front_end import ArrivalProbe, arrival_costs, bare, fit_plane, front_end, nested, with_front_end
from batchlab.calibrate.twin_check import Twin
from batchlab.run.config import load_config

# NOTE: streams long enough that one arrival's prompt step ends before the next arrives (else a
# request is admitted beside another's decode row, and pays per-row for it too)
PROBE = ArrivalProbe(prompts=(32, 128, 384), streams=(8, 16, 26), rounds=2)


def test_the_plane_through_the_excess_is_least_squares_and_never_below_zero():
    exact = {(n, p): 0.001 + 2e-5 * p + 3e-4 * n for n in (4, 16) for p in (32, 384)}
    assert fit_plane(exact) == pytest.approx((0.001, 2e-5, 3e-4))
    # falling with the prompt: no per-token part; the rest fitted without it
    level, per_token, per_row = fit_plane({(4, 32): 0.004, (4, 384): 0.002, (16, 32): 0.007, (16, 384): 0.005})
    assert per_token == 0.0 and per_row == pytest.approx(0.00025) and level == pytest.approx(0.002)
    # a plane that would cross below zero at no rows: none per request
    level, per_token, per_row = fit_plane({(4, 32): 0.0001, (26, 32): 0.0067, (16, 32): 0.0032})
    assert level == 0.0 and per_token == 0.0 and per_row > 0
    assert fit_plane({(16, 64): -0.001}) == (0.0, 0.0, 0.0)
    assert nested({(16, 384): 2.0, (4, 32): 1.0, (16, 32): 3.0}) == {4: {32: 1.0}, 16: {32: 3.0, 384: 2.0}}


@pytest.mark.parametrize("engine_s, per_token, per_row", [(0.0, 0.0, 0.0), (0.002, 0.0, 0.0), (0.0005, 3e-5, 0.0),
                                                           (0.0, 0.0, 2e-4), (0.001, 1e-5, 1e-4)])
def test_a_server_whose_front_end_takes_engine_time_is_priced_back_from_its_arrivals(engine_s, per_token, per_row):
    # the "server" is a twin with a known front end on its engine; the probe, on it and on the
    # same step model without any front end, must give that front end back
    cfg = load_config(None, ["strategies=[continuous]", "continuous.max_num_seqs=64"])
    steps = replace(load_cost("toy"), kv_budget_bytes=1 << 40)
    known = replace(steps, frontend_on_engine=True, frontend_s=engine_s, frontend_s_per_token=per_token,
                    admit_s_per_row=per_row)
    server = Twin(cfg, cost=known).replay
    measured = arrival_costs(server, PROBE)            # virtual time: every round alike
    fe = front_end(measured, Twin(cfg, cost=bare(known)).replay, before_s=0.004, probe=PROBE)
    # the streams pay every second of it: the front end runs while they decode (to 2 % of the
    # largest value tried: a long prompt's arrival now and then still meets the one before it)
    assert fe.engine_s == pytest.approx(engine_s, abs=4e-5)
    assert fe.engine_s_per_token == pytest.approx(per_token, abs=6e-7)
    assert fe.engine_s_per_row == pytest.approx(per_row, abs=4e-6)
    priced = with_front_end(steps, fe)
    assert priced.frontend_on_engine and priced.first_token_s == pytest.approx(max(0.0, 0.004 - fe.engine_s))
    assert priced.admit_s_per_row == fe.engine_s_per_row
    assert set(fe.record()["server_s"]) == {8, 16, 26}
