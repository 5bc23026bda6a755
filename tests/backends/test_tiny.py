import json

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends import tiny  # noqa: E402
from batchlab.cli import main  # noqa: E402


def test_tiny_model_loads_through_from_pretrained(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert tok.pad_token_id is not None and tok.eos_token_id is not None
    assert tok.pad_token_id != tok.eos_token_id
    assert 2500 <= len(tok) <= 3000
    assert model.config.max_position_embeddings >= 2048
    assert model.config.hidden_size == 256 and model.config.num_hidden_layers == 4
    n_params = sum(p.numel() for p in model.parameters())
    assert 3_000_000 < n_params < 6_000_000
    ids = tok("Hello batching world.").input_ids
    assert tok.decode(ids) == "Hello batching world."      # byte-level BPE round-trips any text


def test_ensure_is_cached_and_alias_resolves(tiny_model_dir, monkeypatch):
    assert tiny.ensure_tiny_model(tiny_model_dir) == tiny_model_dir
    assert tiny.resolve_model("tiny") == str(tiny_model_dir)
    assert tiny.resolve_model("mistralai/Mistral-7B-Instruct-v0.3") == "mistralai/Mistral-7B-Instruct-v0.3"
    called = []
    monkeypatch.setattr(tiny, "make_tiny_model", lambda *a, **k: called.append(a))
    tiny.ensure_tiny_model(tiny_model_dir)
    assert called == []                                       # already built: no rebuild


def test_corpus_is_deterministic():
    assert tiny.corpus(500, 3) == tiny.corpus(500, 3)
    assert tiny.corpus(500, 3) != tiny.corpus(500, 4)


def test_data_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHLAB_DATA", str(tmp_path))
    assert tiny.data_dir() == tmp_path


def test_make_tiny_model_command(tmp_path):
    out = tmp_path / "m"
    result = CliRunner().invoke(main, ["make-tiny-model", str(out), "--vocab-size", "400"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / tiny.MARKER).read_text())["vocab_size"] == 400
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()


def test_make_tiny_model_command_rejects_bad_vocab(tmp_path):
    result = CliRunner().invoke(main, ["make-tiny-model", str(tmp_path / "m"), "--vocab-size", "10"])
    assert result.exit_code == 2 and "vocab-size" in result.output
