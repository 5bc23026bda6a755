"""Real shapes, random weights (backends/random_model.py): 7B shapes on the meta device only (no
14 GB here), the toy `mini-llama` shape built for real on CPU, and `configs/full.yaml` run end to end
with it. CUDA builds are in test_cuda.py."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends import hf_common as hc  # noqa: E402
from batchlab.backends import hf_hub  # noqa: E402
from batchlab.backends import random_model as rm  # noqa: E402
from batchlab.errors import ConfigError  # noqa: E402
from batchlab.run.config import load_config  # noqa: E402

PUBLISHED = ["mistral-7b", "llama2-7b", "llama3-8b", "tinyllama-1.1b"]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_shape_has_the_published_parameter_count_on_meta(name):
    model = rm.build_on_meta(f"random:{name}")
    params = list(model.parameters())
    assert all(p.is_meta for p in params)                  # nothing was allocated
    count = sum(p.numel() for p in params)
    assert count == pytest.approx(rm.shape(name).published_params, rel=0.01)
    assert model.config.vocab_size == rm.shape(name).vocab_size


def test_mistral_shape_matches_the_kv_arithmetic_the_presets_assume():
    cfg = rm.config_of("random:mistral-7b")
    assert hc.kv_bytes_per_token(cfg, torch.float16) == 2 * 32 * 8 * 128 * 2     # 128 KiB, as presets.MISTRAL_7B
    assert type(rm.build_on_meta("random:mistral-7b")).__name__ == "MistralForCausalLM"


@pytest.mark.parametrize("name", PUBLISHED + ["mini-llama"])
def test_the_tokenizer_covers_the_vocabulary_and_puts_specials_where_the_config_says(name):
    tok = rm.tokenizer_for(name)
    cfg = rm.shape(name).config
    assert len(tok) == cfg["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id) == (cfg["bos_token_id"], cfg["eos_token_id"])
    ids = tok("Grüße, world 42!", add_special_tokens=False)["input_ids"]
    assert ids and tok.unk_token_id not in ids                          # byte-level: nothing unknown
    assert tok.decode(ids) == "Grüße, world 42!"
    assert isinstance(tok.decode([cfg["vocab_size"] - 1, 300]), str)   # every id decodes


def test_an_unknown_shape_is_one_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown random shape 'gpt-9' \(known: .*random:mistral-7b"):
        hf_hub.check_model("random:gpt-9")
    for bad in ("random:", "random:../shapes/mistral-7b"):
        with pytest.raises(ConfigError, match="unknown random shape"):
            rm.shape(bad)


def test_preflight_accepts_a_shape_without_asking_the_hub(monkeypatch):
    def no_probe(*a, **k):
        raise AssertionError("the hub was probed for a random shape")
    monkeypatch.setattr(hf_hub, "_probe", no_probe)
    monkeypatch.setattr(hf_hub, "in_hub_cache", no_probe)
    assert hf_hub.check_model("random:mistral-7b") == []
    cfg = load_config(None, ["backend.kind=hf", "backend.model=random:llama3-8b", "backend.device=cpu"])
    assert hc.preflight(cfg) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mini_builds_on_cpu_in_the_target_dtype_with_real_rotary_frequencies(dtype):
    model, tok = rm.build("random:mini-llama", torch.device("cpu"), dtype, seed=3)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert not any(p.is_meta for p in model.parameters()) and not any(b.is_meta for b in model.buffers())
    fresh = type(model.model.rotary_emb)(model.config)                   # what from_config computes
    assert torch.equal(model.model.rotary_emb.inv_freq, fresh.inv_freq)
    again, _ = rm.build("random:mini-llama", torch.device("cpu"), dtype, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))   # seeded
    w = model.model.layers[0].mlp.down_proj.weight.float()
    assert w.std().item() == pytest.approx(0.02, rel=0.1) and model.model.norm.weight.float().eq(1).all()
    with torch.inference_mode():
        logits = model(torch.tensor([[5, 6, 7, 8]])).logits
    assert logits.isfinite().all() and logits.shape[-1] == len(tok)


def test_the_label_says_random_weights_and_load_uses_it():
    cfg = load_config(None, ["backend.kind=hf", "backend.model=random:mini-llama", "backend.device=cpu"])
    lm = hc.load(cfg.backend)
    assert lm.name == "random:mini-llama (random weights)" == rm.label("random:mini-llama")
    assert lm.tokenizer.pad_token_id == lm.tokenizer.eos_token_id and lm.tokenizer.padding_side == "left"
    assert hc.context_length(lm.model) == 4096


def test_full_yaml_runs_on_cpu_with_a_small_random_shape_and_every_output_says_random(tmp_path):
    """On CPU: configs/full.yaml, its backend and batchlab's strategies as they are, with
    `backend.model=random:mini-llama` and a few seconds of traffic (its vLLM baseline needs model
    files, which a random shape does not have: refused below)."""
    out = tmp_path / "full"
    sets = ["strategies=[naive, dynamic, continuous]", "backend.model=random:mini-llama", "backend.device=cpu", "backend.dtype=float32",
            "backend.warmup_batches=1", "traffic.rates=[4]", "traffic.duration_s=1", "traffic.warmup_s=0",
            "traffic.repeats=1", "traffic.output_len=3", "traffic.prompt_len={dist: uniform, low: 8, high: 32}"]
    args = [sys.executable, "-m", "batchlab.cli", "run", str(REPO / "configs" / "full.yaml"), "--out", str(out), "--quiet"]
    res = subprocess.run(args + [x for s in sets for x in ("--set", s)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = pd.read_csv(out / "requests.csv")
    assert set(rows["strategy"]) == {"naive", "dynamic", "continuous"}
    assert set(rows["model"]) == {"random:mini-llama (random weights)"} and (rows["status"] == "finished").all()
    assert "random:mini-llama (random weights)" in (out / "report.md").read_text()
    assert '"model": "random:mini-llama (random weights)"' in (out / "setup.json").read_text()


def test_full_yamls_vllm_on_a_random_shape_is_refused_in_one_line_naming_why(tmp_path):
    out = tmp_path / "never"
    res = subprocess.run([sys.executable, "-m", "batchlab.cli", "run", str(REPO / "configs" / "full.yaml"), "--out", str(out),
                          "--set", "backend.model=random:mini-llama", "--set", "backend.device=cpu"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and not out.exists() and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "random weights that only batchlab builds" in res.stderr


def test_an_unknown_shape_on_the_command_line_exits_2_with_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "never"
    res = subprocess.run([sys.executable, "-m", "batchlab.cli", "run", str(REPO / "configs" / "full.yaml"), "--out", str(out),
                          "--set", "backend.model=random:mistral-70b", "--set", "backend.device=cpu"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and not out.exists()
    assert res.stderr.strip().count("\n") == 0 and "random:mistral-7b" in res.stderr and "Traceback" not in res.stderr
