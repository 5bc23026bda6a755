from dataclasses import replace

import numpy as np
import pytest

from batchlab.backends.cost import StepCost, attention_pairs, warm_weight
from batchlab.backends.presets import load_cost
from batchlab.calibrate.fit import COEFFS, StepSample, fit_step_times, nnls

TRUE = {"overhead_s": 3e-3, "kv_s_per_token": 2e-7, "prefill_s_per_token": 5e-5, "decode_s_per_row": 4e-4,
        "prefill_step_s": 2e-3, "attn_s_per_pair": 2e-9, "admit_s": 3e-4, "warmup_s": 1e-3, "mix_s_per_token_row": 2e-6,
        "dense_s_per_pair": 2e-9}
OLD = dict(TRUE, attn_s_per_pair=0.0, admit_s=0.0, warmup_s=0.0, mix_s_per_token_row=0.0, dense_s_per_pair=0.0)   # the first five terms only
DEFAULT = dict(TRUE, dense_s_per_pair=0.0)      # the terms a fit takes unless asked for more
DENSE = ("dense_s_per_pair",)


def synthetic(coef, noise=0.0, seed=0):
    """Decode steps over a grid of batch x context x step index in the call, and prefill steps over
    prompt lengths at two batch sizes (request-level: prefill rows also decode)."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in (1, 2, 4, 8, 16, 32):
        for ctx in (16, 64, 256, 1024):
            for k in (1, 8, 40):
                rows.append(dict(context_tokens=b * ctx, prefill_tokens=0, decode_rows=b, warm=warm_weight(k)))
    for b in (1, 4):
        for p in (16, 128, 512):
            rows.append(dict(context_tokens=b * p, prefill_tokens=b * p, decode_rows=b,
                             attn_pairs=b * attention_pairs(p, 0), admitted=b, kind="prefill"))
    for b in (1, 16):            # iteration-level: one prompt computed beside b decoding rows
        for p in (16, 128, 512):
            rows.append(dict(context_tokens=b * 40 + p, prefill_tokens=p, decode_rows=b,
                             attn_pairs=attention_pairs(p, 0), admitted=1, kind="prefill"))
    out = []
    for row in rows:
        t = StepCost(**{k: coef.get(k, 0.0) for k in TRUE}, weight_s=0.0, kv_bytes_per_token=1,
                     kv_budget_bytes=1).step_time(row["context_tokens"], row["prefill_tokens"], row["decode_rows"],
                                                  row.get("attn_pairs", 0), row.get("admitted", 0), row.get("warm", 0))
        out.append(StepSample(**row, seconds=t * (1 + noise * rng.standard_normal())))
    return out


def test_recovers_known_parameters_exactly_without_noise():
    for truth, terms in ((DEFAULT, ()), (TRUE, DENSE)):
        fit = fit_step_times(synthetic(truth), with_terms=terms)
        for k in COEFFS:
            assert fit.coefficients[k] == pytest.approx(truth[k], rel=1e-6)
        assert fit.rms_rel_error < 1e-9


def test_an_opt_in_term_is_held_at_zero_unless_asked_for():
    # steps that grow with queries x keys (every row's query against the whole batch's context):
    # a default fit has no term for it and reads the largest batch's steps short; asked for, it
    # takes the term and every step exactly
    samples = synthetic(TRUE)
    plain, dense = fit_step_times(samples), fit_step_times(samples, with_terms=DENSE)
    top = [s for s in samples if s.decode_rows == 32 and s.context_tokens == 32 * 1024]
    assert plain.coefficients["dense_s_per_pair"] == 0.0
    assert np.all(plain.predict(top) < 0.98 * np.array([s.seconds for s in top]))
    assert dense.rms_rel_error < 1e-9
    assert dense.coefficients["dense_s_per_pair"] == pytest.approx(2e-9, rel=1e-6)
    # on steps without it, asking for the term costs nothing
    assert fit_step_times(synthetic(DEFAULT), with_terms=DENSE).coefficients["dense_s_per_pair"] == pytest.approx(0.0, abs=1e-18)
    with pytest.raises(ValueError, match="not an opt-in step-time term"):
        fit_step_times(synthetic(TRUE), with_terms=("admit_s",))


def test_a_term_held_at_zero_is_fitted_without_it():
    # data from the old five-term model: the later terms come out zero, with or without them
    full, without = fit_step_times(synthetic(OLD)), fit_step_times(synthetic(OLD), without=("admit_s", "warmup_s"))
    for k in COEFFS:
        assert full.coefficients[k] == pytest.approx(OLD[k], rel=1e-6, abs=1e-15)
        assert without.coefficients[k] == pytest.approx(OLD[k], rel=1e-6, abs=1e-15)
    # data with a warm-up: held at zero, the fit cannot explain it, and the error says so
    held = fit_step_times(synthetic(DEFAULT), without=("warmup_s",))
    assert held.coefficients["warmup_s"] == 0.0 and held.rms_rel_error > 0.01
    with pytest.raises(ValueError, match="unknown step-time term"):
        fit_step_times(synthetic(TRUE), without=("nonsense",))


def test_recovers_parameters_within_noise():
    fit = fit_step_times(synthetic(DEFAULT, noise=0.02, seed=1))
    assert fit.coefficients["overhead_s"] == pytest.approx(TRUE["overhead_s"], rel=0.05)
    assert fit.coefficients["decode_s_per_row"] == pytest.approx(TRUE["decode_s_per_row"], rel=0.1)
    assert fit.coefficients["prefill_s_per_token"] == pytest.approx(TRUE["prefill_s_per_token"], rel=0.1)
    assert fit.coefficients["prefill_step_s"] == pytest.approx(TRUE["prefill_step_s"], rel=0.3)
    assert 0.005 < fit.rms_rel_error < 0.05


def test_coefficients_are_never_negative():
    # Data that an unconstrained fit would explain with a negative per-row cost.
    coef = dict(DEFAULT, decode_s_per_row=0.0)
    samples = [replace(s, seconds=s.seconds * (1 - 0.01 * s.decode_rows / 32)) for s in synthetic(coef)]
    fit = fit_step_times(samples)
    assert all(v >= 0 for v in fit.coefficients.values())
    assert fit.coefficients["decode_s_per_row"] == 0.0


def test_nnls_matches_unconstrained_when_feasible():
    rng = np.random.default_rng(3)
    a = rng.random((30, 3))
    x_true = np.array([1.0, 2.0, 0.5])
    assert np.allclose(nnls(a, a @ x_true), x_true)


def test_fit_becomes_a_step_cost_and_round_trips(tmp_path):
    fit = fit_step_times(synthetic(DEFAULT))
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
