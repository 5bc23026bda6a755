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


def test_text_model_never_picks_a_token_without_text_of_its_own(tmp_path):
    """tiny-text: every token argmax can pick decodes to whole text alone, as a server streaming
    text decodes it; the silent ones (specials, parts of a character) exist and are never picked,
    and the weights keep their shapes, so a step costs what tiny's does."""
    import torch
    from tokenizers.decoders import DecodeStream
    from transformers import AutoModelForCausalLM, AutoTokenizer
    spec = tiny.TinySpec(vocab_size=400, corpus_words=4000)
    plain = tiny.ensure_tiny_model(tmp_path / "plain", spec)
    text = tiny.ensure_tiny_model(tmp_path / "text", spec, text_tokens_only=True)
    assert tiny.ensure_tiny_model(tmp_path / "text", spec, text_tokens_only=True) == text      # cached, by its marker
    tok = AutoTokenizer.from_pretrained(text)
    silent = tiny.silent_tokens(tok)
    assert {tok.eos_token_id, tok.pad_token_id} <= set(silent) and len(silent) < len(tok) // 2
    assert any(tok.convert_ids_to_tokens(i) not in tiny.SPECIAL_TOKENS for i in silent)   # lone bytes too
    a, b = (AutoModelForCausalLM.from_pretrained(p) for p in (plain, text))
    assert [p.shape for p in a.parameters()] == [p.shape for p in b.parameters()]
    head_a, head_b = a.lm_head.weight.detach(), b.lm_head.weight.detach()
    kept = [i for i in range(len(tok)) if i not in set(silent)]
    assert torch.equal(head_b[silent], torch.zeros_like(head_b[silent])) and torch.equal(head_a[kept], head_b[kept])
    assert all(torch.equal(x, y) for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()) if "lm_head" not in n)
    with torch.no_grad():
        ids = tok("the cat sat on the mat", return_tensors="pt").input_ids
        out = b.generate(ids, max_new_tokens=48, min_new_tokens=48, do_sample=False, eos_token_id=None,
                         pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
    assert not set(out) & set(silent)
    stream = DecodeStream([], skip_special_tokens=True)
    assert all(stream.step(tok._tokenizer, i) for i in out)        # one chunk of text per token
