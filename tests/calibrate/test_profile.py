import json

import pytest
from click.testing import CliRunner

from batchlab.backends.cost import StepCost
from batchlab.backends.presets import load_cost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.calibrate.fit import StepSample
from batchlab.calibrate.profile import Grid, profile_backend, profile_cmd, step_features

SMALL = Grid(batch_sizes=(1, 4, 16), contexts=(16, 128), prompts=(16, 256), new_tokens=6, repeats=1, warmup=1)


@pytest.mark.parametrize("strategy", ["dynamic", "continuous"])
def test_profiling_the_simulator_recovers_its_preset(strategy):
    truth = load_cost("llama2-7b-a100")
    prof = profile_backend(SimulatedBackend(truth), strategy, SMALL)
    c = prof.cost
    assert c.overhead_s + c.weight_s == pytest.approx(truth.overhead_s + truth.weight_s, rel=1e-6)
    for k in ("kv_s_per_token", "prefill_s_per_token", "decode_s_per_row"):
        assert getattr(c, k) == pytest.approx(getattr(truth, k), rel=1e-6), k
    assert prof.fit.rms_rel_error < 1e-6
    assert c.kv_bytes_per_token == truth.kv_bytes_per_token and c.kv_budget_bytes == truth.kv_budget_bytes


def test_step_features_follow_each_path():
    pick = lambda f: (f["context_tokens"], f["prefill_tokens"], f["decode_rows"])   # noqa: E731
    assert pick(step_features("request", 4, 10, 0)) == (40, 40, 4)       # generate(): prefill + first token
    assert pick(step_features("iteration", 4, 10, 0)) == (40, 40, 0)     # engine: a prefill chunk
    assert pick(step_features("request", 4, 10, 3)) == (52, 0, 4)        # decode at context 13 per row
    # a prompt of 10 attends to 1 + 2 + ... + 10 = 55 pairs per row; every row is admitted
    assert step_features("iteration", 4, 10, 0)["attn_pairs"] == 220 and step_features("iteration", 4, 10, 0)["admitted"] == 4
    # the warm-up fades over a generate() call; the engine has no call to warm up in
    assert step_features("request", 4, 10, 1)["warm"] > step_features("request", 4, 10, 8)["warm"] > 0
    assert step_features("iteration", 4, 10, 1)["warm"] == 0.0


def test_profiling_recovers_the_later_terms_from_the_simulator(tmp_path):
    # a simulator with every term of the model: profiling its request-level path finds them again
    from dataclasses import replace
    truth = replace(load_cost("toy"), attn_s_per_pair=1e-8, admit_s=2e-4, warmup_s=5e-4)
    grid = Grid(batch_sizes=(1, 4, 16), contexts=(16, 128), prompts=(16, 64, 256), new_tokens=40, repeats=1, warmup=0)
    prof = profile_backend(SimulatedBackend(truth), "dynamic", grid)
    for k in ("attn_s_per_pair", "admit_s", "warmup_s", "decode_s_per_row", "prefill_s_per_token"):
        assert getattr(prof.cost, k) == pytest.approx(getattr(truth, k), rel=1e-5), k


def test_refit_holds_named_terms_at_zero_and_keeps_the_rest(tmp_path):
    from dataclasses import replace
    truth = replace(load_cost("toy"), warmup_s=5e-4)
    src = tmp_path / "p.json"
    res = CliRunner().invoke(profile_cmd, ["--set", "backend.preset=toy", "--strategy", "dynamic", "--batch-sizes", "1,8",
                                           "--contexts", "16,64", "--prompts", "32,128", "--new-tokens", "40",
                                           "--repeats", "1", "--out", str(src)])
    assert res.exit_code == 0, res.output
    data = json.loads(src.read_text())       # a measured profile of the toy preset has no warm-up to find
    assert data["warmup_s"] == 0.0
    samples = data["samples"]
    for row in samples:                       # give its steps a warm-up, as generate() has on a CPU
        row["seconds"] += truth.warmup_s * row["warm"]
    src.write_text(json.dumps(data))
    dst = tmp_path / "without.json"
    res = CliRunner().invoke(profile_cmd, ["--refit", str(src), "--without", "warmup_s", "--out", str(dst)])
    assert res.exit_code == 0, res.output
    held = json.loads(dst.read_text())
    assert held["warmup_s"] == 0.0 and held["without"] == ["warmup_s"] and held["fit_rms_rel_error"] > 1e-3
    res = CliRunner().invoke(profile_cmd, ["--refit", str(src), "--out", str(tmp_path / "with.json")])
    again = json.loads((tmp_path / "with.json").read_text())
    assert again["warmup_s"] == pytest.approx(5e-4, rel=1e-4) and again["fit_rms_rel_error"] < 1e-6
    res = CliRunner().invoke(profile_cmd, ["--refit", str(src), "--without", "shape_s", "--out", str(tmp_path / "flat.json")])
    assert res.exit_code == 0, res.output          # the shape correction is held off like a term
    assert not json.loads((tmp_path / "flat.json").read_text()).get("shape_s")
    assert again["level"] == "request" and again["vocab_size"] == data["vocab_size"]
    for args, needle in ((["--refit", str(src), "--without", "bogus", "--out", str(dst)], "unknown term"),
                         (["--without", "warmup_s", "--out", str(dst)], "goes with --refit"),
                         (["--refit", str(tmp_path / "none.json"), "--out", str(dst)], "not found")):
        res = CliRunner().invoke(profile_cmd, args)
        assert res.exit_code == 2 and needle in res.output and len(res.output.strip().splitlines()) == 1


def test_an_opt_in_term_is_fitted_where_asked_for_and_a_refit_keeps_it(tmp_path):
    # a simulator whose steps price attention over the whole batch: a default profile reads its
    # largest decode steps short; `--with dense_s_per_pair` finds the term again, the profile says
    # it was asked for, and a refit keeps it unless told otherwise
    from dataclasses import replace
    truth = replace(load_cost("toy"), dense_s_per_pair=2e-10)
    args = ["--set", "backend.preset=toy", "--batch-sizes", "1,4,16,32",
            "--contexts", "16,128,512", "--prompts", "32,128", "--new-tokens", "20", "--repeats", "1", "--warmup", "0"]
    grid = Grid(batch_sizes=(1, 4, 16, 32), contexts=(16, 128, 512), prompts=(32, 128), new_tokens=20, repeats=1, warmup=0)
    plain = profile_backend(SimulatedBackend(truth), "continuous", grid)
    dense = profile_backend(SimulatedBackend(truth), "continuous", replace(grid, terms=("dense_s_per_pair",)))
    assert plain.cost.dense_s_per_pair == 0.0 and plain.fit.rms_rel_error > 1e-3
    assert dense.cost.dense_s_per_pair == pytest.approx(2e-10, rel=1e-5) and dense.fit.rms_rel_error < 1e-6
    src = tmp_path / "plain.json"
    res = CliRunner().invoke(profile_cmd, [*args, "--out", str(src)])
    assert res.exit_code == 0, res.output
    data = json.loads(src.read_text())
    for row in data["samples"]:              # the toy preset's own steps, with the whole-batch attention added
        row["seconds"] += 2e-10 * (row["prefill_tokens"] + row["decode_rows"]) * row["context_tokens"]
    src.write_text(json.dumps(data))
    res = CliRunner().invoke(profile_cmd, ["--refit", str(src), "--with", "dense_s_per_pair", "--out", str(tmp_path / "d.json")])
    assert res.exit_code == 0 and "with dense_s_per_pair" in res.output, res.output
    refit = json.loads((tmp_path / "d.json").read_text())
    assert refit["dense_s_per_pair"] == pytest.approx(2e-10, rel=1e-5) and refit["grid"]["terms"] == ["dense_s_per_pair"]
    CliRunner().invoke(profile_cmd, ["--refit", str(tmp_path / "d.json"), "--out", str(tmp_path / "again.json")])
    assert json.loads((tmp_path / "again.json").read_text())["dense_s_per_pair"] == pytest.approx(2e-10, rel=1e-5)
    CliRunner().invoke(profile_cmd, ["--refit", str(tmp_path / "d.json"), "--with", "", "--out", str(tmp_path / "off.json")])
    assert json.loads((tmp_path / "off.json").read_text())["dense_s_per_pair"] == 0.0
    for extra in (["--refit", str(src)], []):
        res = CliRunner().invoke(profile_cmd, [*extra, *([] if extra else args), "--with", "admit_s", "--out", str(tmp_path / "x.json")])
        assert res.exit_code == 2 and "not an opt-in step-time term" in res.output and len(res.output.strip().splitlines()) == 1
        assert not (tmp_path / "x.json").exists()


def test_preset_is_written_as_a_profile(tmp_path):
    out = tmp_path / "toy.json"
    res = CliRunner().invoke(profile_cmd, ["--preset", "toy", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert StepCost.from_json(out) == load_cost("toy")


def test_cli_profiles_a_sim_backend_and_the_profile_drives_the_simulator(tmp_path):
    out = tmp_path / "p.json"
    res = CliRunner().invoke(profile_cmd, ["--set", "backend.preset=toy", "--strategy", "dynamic", "--batch-sizes", "1,8",
                                           "--contexts", "16,64", "--prompts", "32", "--new-tokens", "4",
                                           "--repeats", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["level"] == "request" and data["fit_rms_rel_error"] < 1e-6 and len(data["samples"]) == data["fit_samples"]
    from batchlab.backends.presets import load_cost as lc
    from batchlab.backends.presets import load_vocab_size
    assert lc("ignored", str(out)).decode_s_per_row == pytest.approx(load_cost("toy").decode_s_per_row)
    assert data["vocab_size"] == 32000 and load_vocab_size("ignored", str(out)) == 32000   # the backend's, kept


@pytest.mark.parametrize("args, needle", [
    (["--batch-sizes", "1,x", "--out", "p.json"], "--batch-sizes"),
    (["missing.yaml", "--out", "p.json"], "config file not found"),
    (["--new-tokens", "1", "--out", "p.json"], "--new-tokens"),
    # a server's streams give one sample per 4-token window: 4 new tokens give none; a prompt beside
    # one and three streams, and two beside one: 3 a prompt, 6 at most
    (["--set", "backend.kind=openai", "--set", "backend.base_url=http://127.0.0.1:9/v1", "--set", "backend.model=m",
      "--set", "strategies=[server]", "--batch-sizes", "1,2,4", "--contexts", "16", "--prompts", "16,64",
      "--streams", "1,3", "--new-tokens", "4", "--out", "p.json"], "the grid gives at most 6 step samples"),
    (["--set", "backend.kind=openai", "--set", "backend.base_url=http://127.0.0.1:9/v1", "--set", "backend.model=m",
      "--set", "strategies=[server]", "--streams", "1,0", "--out", "p.json"], "--streams"),
    (["--set", "backend.kind=openai", "--set", "backend.base_url=http://127.0.0.1:9/v1", "--set", "backend.model=m",
      "--set", "strategies=[server]", "--crowds", "4,-8", "--out", "p.json"], "--crowds"),
    (["--set", "backend.preset=toy", "--crowds", "4,8", "--out", "p.json"], "--crowds probes a server"),
    (["--set", "backend.preset=toy", "--hand-over-fit", "--out", "p.json"], "--hand-over-fit probes a server"),
    (["--set", "backend.kind=openai", "--set", "backend.base_url=http://127.0.0.1:9/v1", "--set", "backend.model=m",
      "--set", "strategies=[server]", "--hand-over-rounds", "-1", "--out", "p.json"], "--hand-over-rounds must be >= 0"),
    (["--set", "backend.kind=openai", "--set", "backend.base_url=http://127.0.0.1:9/v1", "--set", "backend.model=m",
      "--set", "strategies=[server]", "--hand-over-rounds", "0", "--hand-over-fit", "--out", "p.json"],
     ">= 1 with --hand-over-fit"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(profile_cmd, args)
    assert res.exit_code == 2 and needle in res.output and len(res.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.hf
@pytest.mark.parametrize("strategy", ["dynamic", "continuous"])
def test_profiles_the_tiny_hf_model_on_both_paths(strategy, tiny_model_dir):
    from batchlab.backends.hf import HFOptions
    from batchlab.backends.hf_backend import HFBackend
    backend = HFBackend(HFOptions(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                      memory_budget_bytes=1 << 26, warmup_batches=0))
    grid = Grid(batch_sizes=(1, 2, 3), contexts=(8,), prompts=(16,), new_tokens=3, repeats=1, warmup=0)
    prof = profile_backend(backend, strategy, grid)
    assert len(prof.samples) == 3 * 3 + 2 and all(s.seconds > 0 for s in prof.samples)
    assert prof.cost.kv_budget_bytes == 1 << 26 and prof.cost.kv_bytes_per_token > 0
    assert all(v >= 0 for v in prof.fit.coefficients.values())


def test_samples_saved_before_the_later_features_get_them_back_from_the_burst_layout():
    from batchlab.calibrate.profile import older_samples
    grid = Grid(batch_sizes=(1, 4), contexts=(16, 64), prompts=(16, 256), new_tokens=6, repeats=1, warmup=0)
    for strategy, level in (("dynamic", "request"), ("continuous", "iteration")):
        prof = profile_backend(SimulatedBackend(load_cost("toy")), strategy, grid)
        old = [{k: getattr(s, k) for k in ("context_tokens", "prefill_tokens", "decode_rows", "seconds", "kind")}
               for s in prof.samples]
        assert [StepSample(**row) for row in older_samples(old, level)] == prof.samples
