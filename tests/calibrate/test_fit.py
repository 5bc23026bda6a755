import numpy as np
import pytest

from batchlab.backends.cost import StepCost
from batchlab.backends.presets import load_cost
from batchlab.calibrate.fit import COEFFS, StepSample, fit_step_times, nnls

TRUE = {"overhead_s": 3e-3, "kv_s_per_token": 2e-7, "prefill_s_per_token": 5e-5, "decode_s_per_row": 4e-4,
        "prefill_step_s": 2e-3}


def synthetic(coef, noise=0.0, seed=0):
    """Decode steps over a grid of batch x context, and prefill steps over prompt lengths."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in (1, 2, 4, 8, 16, 32):
        for ctx in (16, 64, 256, 1024):
            rows.append((b * ctx, 0, b, "decode"))
    for b in (1, 4):
        for p in (16, 128, 512):
            rows.append((b * p, b * p, b, "prefill"))
    out = []
    for c, p, d, kind in rows:
        t = (coef["overhead_s"] + coef["kv_s_per_token"] * c + coef["prefill_s_per_token"] * p
             + coef["decode_s_per_row"] * d + coef["prefill_step_s"] * (p > 0))
        out.append(StepSample(c, p, d, t * (1 + noise * rng.standard_normal()), kind))
    return out


def test_recovers_known_parameters_exactly_without_noise():
    fit = fit_step_times(synthetic(TRUE))
    for k in COEFFS:
        assert fit.coefficients[k] == pytest.approx(TRUE[k], rel=1e-6)
    assert fit.rms_rel_error < 1e-9


def test_recovers_parameters_within_noise():
    fit = fit_step_times(synthetic(TRUE, noise=0.02, seed=1))
    assert fit.coefficients["overhead_s"] == pytest.approx(TRUE["overhead_s"], rel=0.05)
    assert fit.coefficients["decode_s_per_row"] == pytest.approx(TRUE["decode_s_per_row"], rel=0.1)
    assert fit.coefficients["prefill_s_per_token"] == pytest.approx(TRUE["prefill_s_per_token"], rel=0.1)
    assert fit.coefficients["prefill_step_s"] == pytest.approx(TRUE["prefill_step_s"], rel=0.3)
    assert 0.005 < fit.rms_rel_error < 0.05


def test_coefficients_are_never_negative():
    # Data that an unconstrained fit would explain with a negative per-row cost.
    coef = dict(TRUE, decode_s_per_row=0.0)
    samples = [StepSample(s.context_tokens, s.prefill_tokens, s.decode_rows, s.seconds * (1 - 0.01 * s.decode_rows / 32))
               for s in synthetic(coef)]
    fit = fit_step_times(samples)
    assert all(v >= 0 for v in fit.coefficients.values())
    assert fit.coefficients["decode_s_per_row"] == 0.0


def test_nnls_matches_unconstrained_when_feasible():
    rng = np.random.default_rng(3)
    a = rng.random((30, 3))
    x_true = np.array([1.0, 2.0, 0.5])
    assert np.allclose(nnls(a, a @ x_true), x_true)


def test_fit_becomes_a_step_cost_and_round_trips(tmp_path):
    fit = fit_step_times(synthetic(TRUE))
    cost = fit.to_cost(load_cost("toy"))
    assert cost.weight_s == 0.0 and cost.kv_budget_bytes == load_cost("toy").kv_budget_bytes
    assert cost.step_time(100, 0, 4) == pytest.approx(TRUE["overhead_s"] + 100 * 2e-7 + 4 * 4e-4)
    assert cost.step_time(100, 100, 0) == pytest.approx(TRUE["overhead_s"] + 100 * 2e-7 + 100 * 5e-5 + 2e-3)
    path = tmp_path / "p.json"
    cost.to_json(path, **fit.summary())
    assert StepCost.from_json(path) == cost


def test_too_few_samples_is_an_error():
    with pytest.raises(ValueError, match="at least"):
        fit_step_times(synthetic(TRUE)[:2])
