"""The one step-time function: scalars and arrays agree bit for bit, and it is the fit's model."""
import math

import numpy as np
import pytest

from batchlab.backends.cost import COEFFS, StepCost, features

COST = StepCost(1.1e-3, 8.4e-3, 3.3e-7, 1.7e-5, 4.3e-5, kv_bytes_per_token=2, kv_budget_bytes=10**9,
                prefill_step_s=2.5e-3)


def test_arrays_give_exactly_the_scalar_time_of_each_step():
    ctx = np.array([0, 17, 4096, 123457])
    pre = np.array([0, 17, 0, 512])
    rows = np.array([0, 1, 64, 3])
    many = COST.step_time(ctx, pre, rows)
    one = [COST.step_time(int(c), int(p), int(r)) for c, p, r in zip(ctx, pre, rows)]
    assert many.tolist() == one          # bit-identical, not approximately equal


def test_the_prefill_pass_is_charged_only_in_steps_with_prompt_tokens():
    assert COST.step_time(10, 1, 0) - COST.step_time(10, 0, 0) == pytest.approx(COST.prefill_s_per_token + 2.5e-3)
    assert COST.fixed_s == pytest.approx(1.1e-3 + 8.4e-3)


@pytest.mark.parametrize("step", [(0, 0, 0), (300, 0, 12), (64, 64, 0), (5000, 128, 40)])
def test_step_time_is_the_sum_the_fit_estimates(step):
    """calibrate/fit.py regresses on `features`; a fitted cost must predict with the same terms."""
    coef = [COST.overhead_s + COST.weight_s] + [getattr(COST, k) for k in COEFFS[1:]]
    assert COST.step_time(*step) == pytest.approx(float(np.dot(coef, features(*step))), rel=1e-12)


@pytest.mark.parametrize("step", [(300, 0, 12), (0, 64, 0), (5000, 128, 40)])
def test_added_time_is_step_time_less_the_fixed_part(step):
    assert COST.fixed_s + COST.added_s(*step) == pytest.approx(COST.step_time(*step), rel=1e-12)


DENSE = StepCost(1.1e-3, 8.4e-3, 3.3e-7, 1.7e-5, 4.3e-5, kv_bytes_per_token=2, kv_budget_bytes=10**9,
                 prefill_step_s=2.5e-3, dense_s_per_pair=3e-11)


def test_dense_attention_prices_every_query_of_a_step_against_every_key_it_reads():
    # 10 decode rows over 1,000 context tokens in all: 10 x 1,000 pairs; a 64-token prompt beside
    # them over 1,064: (64 + 10) x 1,064, the prompt's own keys counted for every query too
    assert DENSE.step_time(1000, 0, 10) - COST.step_time(1000, 0, 10) == pytest.approx(3e-11 * 10 * 1000, rel=1e-9)
    assert DENSE.step_time(1064, 64, 10) - COST.step_time(1064, 64, 10) == pytest.approx(3e-11 * 74 * 1064, rel=1e-9)
    coef = [DENSE.overhead_s + DENSE.weight_s] + [getattr(DENSE, k) for k in COEFFS[1:]]
    assert DENSE.step_time(1064, 64, 10) == pytest.approx(float(np.dot(coef, features(1064, 64, 10))), rel=1e-12)
    ctx, pre, rows = np.array([0, 17, 4096]), np.array([0, 17, 0]), np.array([0, 1, 64])
    assert DENSE.step_time(ctx, pre, rows).tolist() == [DENSE.step_time(int(c), int(p), int(r)) for c, p, r in zip(ctx, pre, rows)]


@pytest.mark.parametrize("cost", [COST, StepCost(2e-4, 0.0, 0.0, 4e-5, 5e-4, kv_bytes_per_token=1, kv_budget_bytes=1), DENSE])
def test_decode_ends_are_the_running_sums_of_step_time_bit_for_bit(cost):
    """The simulator's decode windows stamp these; stepping one at a time must give the same floats."""
    for start, context, rows, steps in [(0.0, 0, 1, 1), (12.345678, 4097, 7, 40), (3600.1, 123457, 64, 300)]:
        t, expected = start, []
        for i in range(steps):
            t += cost.step_time(context + rows * i, 0, rows)
            expected.append(t)
        assert cost.decode_ends(start, context, rows, steps) == expected
    assert cost.decode_ends(1.0, 10, 3, 0) == []


def test_decode_ends_stop_after_the_first_step_reaching_until():
    ends = COST.decode_ends(5.0, 100, 4, 50)
    assert COST.decode_ends(5.0, 100, 4, 50, until=ends[9]) == ends[:10]
    assert COST.decode_ends(5.0, 100, 4, 50, until=ends[9] - 1e-9) == ends[:10]
    assert COST.decode_ends(5.0, 100, 4, 50, until=ends[-1] + 1) == ends


def test_decode_ends_keep_the_zero_terms_when_they_are_not_zero():
    """An infinite prefill coefficient makes step_time's prefill terms NaN even in a decode step."""
    cost = StepCost(1e-3, 0.0, 1e-6, float("inf"), 1e-4, kv_bytes_per_token=1, kv_budget_bytes=1)
    assert all(math.isnan(t) for t in cost.decode_ends(0.0, 10, 2, 3))
    assert math.isnan(cost.step_time(10, 0, 2))


def test_a_front_end_on_the_engine_is_engine_time_not_a_delay():
    from dataclasses import replace
    beside = replace(COST, frontend_s=5e-3)
    shared = replace(beside, frontend_on_engine=True)
    assert (beside.arrival_delay_s, beside.frontend_engine_s) == (5e-3, 0.0)
    assert (shared.arrival_delay_s, shared.frontend_engine_s) == (0.0, 5e-3)
    assert shared.step_time(100, 64, 8, admitted=2) == beside.step_time(100, 64, 8, admitted=2)   # steps alike


def test_a_front_end_per_prompt_token_is_engine_time_and_scales_with_the_machine():
    from dataclasses import replace
    shared = replace(COST, frontend_s=1e-3, frontend_on_engine=True, frontend_s_per_token=2e-5)
    assert (shared.frontend_engine_s, shared.frontend_engine_s_per_token) == (1e-3, 2e-5)
    assert shared.scaled(2.0).frontend_s_per_token == pytest.approx(4e-5)
    with pytest.raises(ValueError, match="set frontend_on_engine"):
        replace(COST, frontend_s_per_token=2e-5)          # a delay off the engine has no per-token part


def test_an_arrival_per_running_row_is_charged_in_the_step_that_admits_it_and_scales_with_the_machine():
    from dataclasses import replace
    per_row = replace(COST, admit_s_per_row=2e-4)
    assert per_row.step_time(900, 32, 20, 0.0, 1) - COST.step_time(900, 32, 20, 0.0, 1) == pytest.approx(20 * 2e-4)
    assert per_row.step_time(900, 64, 20, 0.0, 2) - COST.step_time(900, 64, 20, 0.0, 2) == pytest.approx(40 * 2e-4)
    assert per_row.step_time(900, 0, 20) == COST.step_time(900, 0, 20)        # a step admitting nobody: nothing
    assert per_row.scaled(1.5).admit_s_per_row == pytest.approx(3e-4)
    assert per_row.scaled(1.0, first=2.0).admit_s_per_row == pytest.approx(4e-4)   # paid before the first token
    # only the admissions the step took as they came pay it; one from a queue does not
    assert per_row.step_time(900, 64, 20, 0.0, 2, arrived=1) - COST.step_time(900, 64, 20, 0.0, 2) == pytest.approx(20 * 2e-4)
    assert per_row.step_time(900, 64, 20, 0.0, 2, arrived=0) == COST.step_time(900, 64, 20, 0.0, 2)


def test_a_scaled_model_times_every_step_by_the_factor_and_keeps_its_sizes():
    from dataclasses import replace

    from batchlab.backends.presets import load_cost
    toy = replace(load_cost("toy"), attn_s_per_pair=1e-9, admit_s=1e-4, warmup_s=2e-4, frontend_s=3e-3,
                  shape_s=((1.0, 0.001), (64.0, -0.002)))
    slow = toy.scaled(1.5)
    assert slow.step_time(300, 40, 6, 900.0, 2, 0.5) == pytest.approx(1.5 * toy.step_time(300, 40, 6, 900.0, 2, 0.5))
    assert slow.frontend_s == pytest.approx(1.5 * toy.frontend_s)
    assert (slow.kv_bytes_per_token, slow.kv_budget_bytes) == (toy.kv_bytes_per_token, toy.kv_budget_bytes)


def test_the_first_token_factor_scales_only_what_a_request_pays_before_its_first_token():
    from dataclasses import replace

    from batchlab.backends.cost import FIRST_TOKEN_TERMS, TIME_TERMS
    from batchlab.backends.presets import load_cost
    toy = replace(load_cost("toy"), prefill_step_s=1e-3, attn_s_per_pair=1e-9, admit_s=1e-4, frontend_s=3e-3,
                  shape_s=((1.0, 0.001), (64.0, -0.002)))
    both = toy.scaled(1.5, first=2.0)
    for term in TIME_TERMS:
        k = 3.0 if term in FIRST_TOKEN_TERMS else 1.5
        assert getattr(both, term) == pytest.approx(k * getattr(toy, term)), term
    assert both.shape_s == toy.scaled(1.5).shape_s
    # a decode step (no prompt tokens, no admission) costs what the live factor alone says
    assert both.step_time(300, 0, 6) == pytest.approx(1.5 * toy.step_time(300, 0, 6))
    assert both.step_time(300, 40, 6, 900.0, 2) > toy.scaled(1.5).step_time(300, 40, 6, 900.0, 2)


def test_a_first_token_delay_holds_requests_off_the_engine_and_no_machine_factor_scales_it():
    on = StepCost(0.001, 0, 0, 0, 0, kv_bytes_per_token=1, kv_budget_bytes=1, frontend_s=0.003,
                  frontend_on_engine=True, first_token_s=0.002)
    assert on.arrival_delay_s == 0.002 and on.frontend_engine_s == 0.003
    beside = StepCost(0.001, 0, 0, 0, 0, kv_bytes_per_token=1, kv_budget_bytes=1, frontend_s=0.003, first_token_s=0.002)
    assert beside.arrival_delay_s == pytest.approx(0.005) and beside.frontend_engine_s == 0.0
    assert beside.scaled(2.0, 3.0).first_token_s == 0.002      # a correction measured in seconds, not a step term


def test_a_negative_first_token_move_takes_from_the_delay_then_the_front_end_never_below_none():
    c = StepCost(0.001, 0, 0, 0, 0, kv_bytes_per_token=1, kv_budget_bytes=1, frontend_s=0.004, first_token_s=0.002)
    assert c.first_token_moved(0.003).first_token_s == pytest.approx(0.005)
    less = c.first_token_moved(-0.003)
    assert (less.first_token_s, less.frontend_s) == pytest.approx((0.0, 0.003))
    none = c.first_token_moved(-0.050)
    assert (none.first_token_s, none.frontend_s, none.arrival_delay_s) == (0.0, 0.0, 0.0)


def test_rows_past_the_profile_pay_the_carried_growth_and_no_step_within_it_changes():
    from dataclasses import replace
    past = replace(COST, rows_profiled=32, beyond_s_per_row=2e-4)
    for step in [(900, 0, 1), (900, 64, 32), (0, 0, 0)]:
        assert past.step_time(*step) == COST.step_time(*step)          # within the profile: bit for bit
    assert past.step_time(9000, 0, 128) - COST.step_time(9000, 0, 128) == pytest.approx(96 * 2e-4)
    assert past.step_time(9000, 512, 40) - COST.step_time(9000, 512, 40) == pytest.approx(8 * 2e-4)  # rows, not tokens
    ctx, pre, rows = np.array([100, 9000, 9000]), np.array([0, 0, 512]), np.array([8, 128, 40])
    assert past.step_time(ctx, pre, rows).tolist() == [past.step_time(int(c), int(p), int(r)) for c, p, r in zip(ctx, pre, rows)]
    assert past.scaled(1.5).beyond_s_per_row == pytest.approx(3e-4)
    t, expected = 0.0, []                              # a decode window past the profile: the same sums
    for i in range(20):
        t += past.step_time(4000 + 64 * i, 0, 64)
        expected.append(t)
    assert past.decode_ends(0.0, 4000, 64, 20) == expected
