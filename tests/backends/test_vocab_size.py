"""The vocabulary an engine states in its facts (EngineFacts.vocab_size) and a load target through
`vocab_size()`: the token ids a prompt may use, on every backend (a server checks them)."""
from __future__ import annotations

import json

import pytest

from batchlab.backends import make_backend
from batchlab.backends.base import LoadTarget
from batchlab.backends.presets import PRESETS, VOCAB_SIZES, load_cost, load_vocab_size
from batchlab.backends.simulated import SimulatedBackend
from batchlab.errors import ConfigError
from batchlab.run.config import load_config


def test_a_load_target_without_a_vocabulary_says_none():
    class Bare(LoadTarget):
        def session(self, concurrency):
            raise NotImplementedError

        async def send(self, request, session, clock):
            raise NotImplementedError
    assert Bare().vocab_size() is None


@pytest.mark.parametrize("preset,size", [("llama2-7b-a100", 32000), ("mistral-7b-a100", 32768),
                                         ("tinyllama-3090", 32000), ("toy", 32000)])
def test_simulator_answers_its_presets_vocabulary(preset, size):
    cfg = load_config(None, ["backend.kind=sim", f"backend.preset={preset}"])
    assert make_backend(cfg).facts().vocab_size == size
    assert set(VOCAB_SIZES) == set(PRESETS)          # a new preset must say its vocabulary


def test_a_profile_gives_its_vocab_size_or_the_default(tmp_path):
    with_size, without = tmp_path / "with.json", tmp_path / "without.json"
    load_cost("toy").to_json(with_size, vocab_size=50257)
    load_cost("toy").to_json(without)
    assert load_vocab_size("toy", str(with_size)) == 50257
    assert load_vocab_size("llama2-7b-a100", str(without)) == 32000
    cfg = load_config(None, ["backend.kind=sim", f"backend.profile={with_size}"])
    backend = make_backend(cfg)
    assert backend.facts().vocab_size == 50257 and backend.cost == load_cost("toy")


@pytest.mark.parametrize("value", [0, -5, 1.5, "32000", None])
def test_a_profile_with_a_bad_vocab_size_is_a_config_error(tmp_path, value):
    path = tmp_path / "p.json"
    load_cost("toy").to_json(path, vocab_size=value)
    with pytest.raises(ConfigError, match="vocab_size must be a positive integer"):
        load_vocab_size("toy", str(path))


def test_a_profile_that_is_not_json_is_a_config_error(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a batchlab profile"):
        load_vocab_size("toy", str(path))
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match="not a batchlab profile"):
        load_vocab_size("toy", str(path))


def test_the_simulators_default_vocabulary():
    assert SimulatedBackend(load_cost("toy")).facts().vocab_size == 32000
    assert SimulatedBackend(load_cost("toy"), vocab_size=100).facts().vocab_size == 100


def test_hf_backends_answer_the_length_of_their_tokenizer():
    hc = pytest.importorskip("batchlab.backends.hf_common")
    torch = pytest.importorskip("torch")

    class Tokenizer:
        def __len__(self):
            return 3001

    from batchlab.backends.hf_cb_backend import HFCBBackend
    loaded = hc.Loaded(model=None, tokenizer=Tokenizer(), device=torch.device("cpu"), dtype=torch.float32, name="fake")
    assert HFCBBackend(None, None, loaded=loaded).vocab_size() == 3001
