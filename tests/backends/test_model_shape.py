import json

import pytest

from batchlab.backends.model_shape import bundled, find_config, load_model_config, load_shape, shape_from_config
from batchlab.errors import ConfigError

LLAMA3_8B = bundled("llama3-8b", "test")["config"]


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-8b", "mistral-7b", "tinyllama-1.1b", "llama3-70b", "mixtral-8x7b"])
def test_the_parameter_count_is_the_published_one(name):
    data = bundled(name, "test")
    assert load_shape(f"random:{name}").params == data["published_params"]


def test_a_mixture_of_experts_computes_its_routed_experts_only():
    s = load_shape("random:mixtral-8x7b")
    assert s.experts == 8
    assert s.active_params == pytest.approx(12.88e9, rel=0.005)       # Mistral's "12.9B active"
    assert s.compute_params == s.active_params < s.params


def test_grouped_query_attention_keeps_fewer_kv_heads():
    s = load_shape("random:llama3-8b")
    assert (s.layers, s.kv_heads, s.head_dim, s.hidden) == (32, 8, 128, 4096)
    assert s.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2          # 128 KiB per token in 16 bits
    assert load_shape("random:llama2-7b").kv_bytes_per_token == 4 * s.kv_bytes_per_token   # 32 KV heads


def test_tied_embeddings_and_attention_bias_count_as_the_checkpoint_does():
    base = dict(LLAMA3_8B)
    tied = shape_from_config(base | {"tie_word_embeddings": True})
    assert shape_from_config(base).params - tied.params == 128256 * 4096
    qwen = shape_from_config(base | {"model_type": "qwen2"})       # q, k and v projections carry a bias
    assert qwen.params - shape_from_config(base).params == 32 * 128 * (32 + 2 * 8)


def test_dtype_as_served():
    assert load_shape("random:llama3-8b").dtype_bytes == 2
    assert shape_from_config(LLAMA3_8B | {"torch_dtype": "float32"}).dtype_bytes == 2    # served in 16 bits
    fp8 = shape_from_config(LLAMA3_8B | {"quantization_config": {"quant_method": "fp8"}})
    assert fp8.dtype_bytes == 1 and fp8.weight_bytes == fp8.params
    assert fp8.kv_bytes_per_token == load_shape("random:llama3-8b").kv_bytes_per_token    # the cache stays 16-bit
    assert load_shape("random:llama3-8b", "fp8").dtype_bytes == 1


def test_a_config_is_found_as_a_file_a_directory_or_in_the_hub_cache(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert find_config(str(model)) == model / "config.json"
    assert find_config(str(model / "config.json")) == model / "config.json"
    cache = tmp_path / "hub"
    repo = cache / "models--org--name"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc\n")
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "config.json").write_text(json.dumps(LLAMA3_8B))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert find_config("org/name") == repo / "snapshots" / "abc" / "config.json"
    assert find_config(str(repo)) == repo / "snapshots" / "abc" / "config.json"
    assert load_shape("org/name").params == load_shape("random:llama3-8b").params


@pytest.mark.parametrize("spec, needle", [
    ("random:nope", "unknown random shape 'nope'"),
    ("org/absent", "not in the local hub cache"),
    ("./no/such/dir", "no such file or directory"),
])
def test_what_cannot_be_read_is_one_line(spec, needle, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=needle):
        load_model_config(spec)


def test_a_config_without_a_needed_field_names_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_shape(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a model config"):
        load_shape(str(path))
