"""Presets say what kind they are (roofline estimate, measured, toy), and a profile JSON in the
presets folder becomes a measured preset beside the rooflines."""
import pytest

from batchlab.backends import make_backend, presets
from batchlab.backends.cost import StepCost
from batchlab.backends.presets import MEASURED, ROOFLINE, TOY, load_cost, measured_presets, preset_kind, term_ratios
from batchlab.run.config import load_config


def test_every_builtin_preset_has_a_kind_and_rooflines_say_so_in_their_description():
    kinds = {name: p.kind for name, p in presets.PRESETS.items()}
    assert kinds["toy"] == TOY and kinds["mistral-7b-a100"] == kinds["mistral-7b-h200"] == ROOFLINE
    for name, kind in kinds.items():
        cost = load_cost(name)
        assert preset_kind(cost) == kind
        if kind == ROOFLINE:
            assert cost.description.endswith(", roofline estimate")


def test_the_h200_roofline_reads_mistral_weights_at_80_percent_of_4_8_tb_s():
    h200 = load_cost("mistral-7b-h200")
    assert h200.weight_s == pytest.approx(7.24e9 * 2 / (0.8 * 4.8e12))
    assert h200.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert presets.VOCAB_SIZES["mistral-7b-h200"] == 32768


def test_a_profile_in_the_presets_folder_is_a_measured_preset(tmp_path):
    StepCost(1e-3, 0.0, 2e-8, 5e-5, 1e-4, 131072, 10**11, name="random:mistral-7b (random weights)-iteration",
             description="profile of random:mistral-7b on cuda").to_json(tmp_path / "mistral-7b-h200-measured.json",
                                                                        level="iteration", vocab_size=32768)
    (tmp_path / "notes.txt").write_text("not a preset")
    found = measured_presets(tmp_path)
    assert list(found) == ["mistral-7b-h200-measured"]
    p = found["mistral-7b-h200-measured"]
    assert p.kind == MEASURED and p.vocab_size == 32768 and p.source.endswith("mistral-7b-h200-measured.json")
    cost = p.build()
    assert cost.name == "mistral-7b-h200-measured" and cost.overhead_s == 1e-3
    assert cost.description == "mistral-7b-h200-measured: profile of random:mistral-7b on cuda; measured"
    assert measured_presets(tmp_path / "absent") == {}


def test_the_simulator_names_its_preset_kind_in_setup(monkeypatch):
    assert make_backend(load_config(None, [])).describe()["preset_kind"] == ROOFLINE
    custom = StepCost(1e-3, 0, 0, 0, 0, 1, 1, name="mine-iteration")
    assert preset_kind(custom) == "measured (profile)"
    monkeypatch.setitem(presets.PRESETS, "h200-measured", presets.Preset(lambda: custom, MEASURED))
    assert load_cost("h200-measured") is custom


def test_term_ratios_compare_measured_with_estimated_term_by_term():
    est = load_cost("mistral-7b-h200")
    measured = StepCost(est.fixed_s * 3, 0.0, est.kv_s_per_token * 2, est.prefill_s_per_token, 0.0, 1, 1, prefill_step_s=0.01)
    r = term_ratios(est, measured)
    assert r["fixed_s"]["ratio"] == pytest.approx(3) and r["kv_s_per_token"]["ratio"] == pytest.approx(2)
    assert r["prefill_s_per_token"]["ratio"] == pytest.approx(1) and r["decode_s_per_row"]["ratio"] == 0
    assert r["prefill_step_s"] == {"estimate": 0.0, "measured": 0.01, "ratio": None}
