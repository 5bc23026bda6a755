"""A model's shape, read from its Hugging Face `config.json`: what the roofline needs to price a step.

Decode reads every weight once per step and each running sequence's KV cache, so the shape that
matters is the parameter count (total, and active per token for a mixture of experts), the layers,
the KV heads and their size (grouped-query attention keeps fewer KV heads than query heads) and
the bytes per value. The parameter count is computed from the config, as the checkpoint would
hold it: embeddings (and an untied output head), per layer the attention projections, the gated
MLP (or every expert and its router), and the norms.

`backend.shape` names the config: a `config.json` file, a model directory, a cached hub
model (`org/name`, or its `models--org--name` cache directory), or a bundled `random:<shape>`.
NOTE: no network and no transformers here: the simulator installs in seconds and sizes offline.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchlab.errors import ConfigError

PREFIX = "random:"               # a bundled shape: `random:<name>`
SHAPES_DIR = Path(__file__).resolve().parents[1] / "data" / "shapes"
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}      # as served (backend.dtype)


@dataclass(frozen=True)
class ModelShape:
    params: float                 # parameter count (every expert of a mixture)
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2          # bytes per weight as served
    hidden: int = 0               # the residual stream's width (what a tensor-parallel all-reduce moves per token)
    active_params: float = 0.0    # computed per token (a mixture's routed experts only); 0: all of them
    experts: int = 0              # a mixture's experts per layer (0: a dense model)
    title: str = ""
    kv_dtype_bytes: int = 2       # bytes per cached K or V value (engines keep 16 bits unless told otherwise)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def compute_params(self) -> float:
        """Parameters a token's forward pass multiplies by (2 FLOPs each)."""
        return self.active_params or self.params

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if default is not None:
        return default
    raise ConfigError(f"model config: no {' or '.join(keys)} (a decoder-only transformer's config.json has it)")


def shape_from_config(cfg: dict[str, Any], title: str = "", dtype: str = "auto") -> ModelShape:
    """The shape of a decoder-only transformer from its config.json fields (Llama, Mistral,
    Mixtral, Qwen2/3 and their MoE variants, Gemma, Phi-3 name them alike)."""
    text = cfg.get("text_config")
    cfg = text if isinstance(text, dict) else cfg           # a multimodal config's language model
    hidden = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    vocab = int(_get(cfg, "vocab_size"))
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    per_token = int(_get(cfg, "num_experts_per_tok", "moe_topk", default=0)) if experts else 0
    ffn = int(_get(cfg, "moe_intermediate_size", "intermediate_size", "n_inner")) if experts else \
        int(_get(cfg, "intermediate_size", "n_inner", default=4 * hidden))
    shared = int(_get(cfg, "shared_expert_intermediate_size", default=0)) if experts else 0
    bias = bool(cfg.get("attention_bias")) or cfg.get("model_type") == "qwen2"
    attention = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
    attention += head_dim * (heads + 2 * kv_heads) if bias else 0
    mlp = 3 * hidden * ffn                                  # gated MLP: gate, up and down projections
    norms = 2 * hidden
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    if experts:
        router, shared_mlp = hidden * experts, 3 * hidden * shared
        total = embed + hidden + layers * (attention + norms + router + shared_mlp + experts * mlp)
        active = embed + hidden + layers * (attention + norms + router + shared_mlp + per_token * mlp)
    else:
        total = active = embed + hidden + layers * (attention + norms + mlp)
    return ModelShape(float(total), layers, kv_heads, head_dim, dtype_bytes_of(cfg, dtype), hidden,
                      float(active) if experts else 0.0, experts, title or str(cfg.get("_name_or_path") or ""))


def dtype_bytes_of(cfg: dict[str, Any], dtype: str) -> int:
    """Bytes per weight as served: `dtype` if given, else fp8 for an fp8-quantized checkpoint and
    16 bits otherwise (a float32 checkpoint is served in bf16, as vLLM's `--dtype auto` does)."""
    if dtype != "auto":
        return DTYPE_BYTES[dtype]
    quant = cfg.get("quantization_config") or {}
    if "fp8" in str(quant.get("quant_method", "")).lower() or "e4m3" in json.dumps(quant).lower():
        return 1
    return 2


def load_model_config(spec: str) -> tuple[dict[str, Any], str]:
    """(config.json's fields, a title) for `backend.shape`: a file, a model directory, a
    hub cache directory, an `org/name` in the local hub cache, or a bundled `random:<shape>`."""
    if spec.startswith(PREFIX):
        data = bundled(spec.removeprefix(PREFIX), "backend.shape")
        return data["config"], data["title"]
    path = find_config(spec)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"backend.shape {spec!r}: {path} is not a readable JSON config: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"backend.shape {spec!r}: {path} is not a model config (a JSON object)")
    return data, spec


def find_config(spec: str) -> Path:
    """The config.json `spec` points to, or one line saying what was looked for."""
    p = Path(spec).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        for candidate in [p / "config.json", *_snapshots(p)]:
            if candidate.is_file():
                return candidate
        raise ConfigError(f"backend.shape {spec!r}: no config.json in that directory (nor in a hub cache's snapshots)")
    if "/" in spec and not spec.startswith((".", "/", "~")):
        cached = Path(hub_cache_dir()) / ("models--" + spec.replace("/", "--"))
        for candidate in _snapshots(cached):
            if candidate.is_file():
                return candidate
        raise ConfigError(f"backend.shape {spec!r}: not a file or directory, and not in the local hub "
                          f"cache ({hub_cache_dir()}); download its config.json and give its path")
    raise ConfigError(f"backend.shape {spec!r}: no such file or directory")


def known_shapes() -> list[str]:
    return sorted(p.stem for p in SHAPES_DIR.glob("*.json"))


def bundled(key: str, where: str) -> dict[str, Any]:
    """A bundled shape's file ({title, published_params, config}); one line naming the known ones."""
    path = SHAPES_DIR / f"{key}.json"
    if not key or "/" in key or not path.is_file():
        raise ConfigError(f"{where} {PREFIX + key!r}: unknown random shape {key!r} "
                          f"(known: {', '.join(PREFIX + s for s in known_shapes())})")
    return json.loads(path.read_text())


def hub_cache_dir() -> str:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def _snapshots(repo: Path) -> list[Path]:
    """A hub cache directory's config.json files, the main branch's snapshot first."""
    ref = repo / "refs" / "main"
    first = [repo / "snapshots" / ref.read_text().strip() / "config.json"] if ref.is_file() else []
    return first + sorted((repo / "snapshots").glob("*/config.json"))


def load_shape(spec: str, dtype: str = "auto") -> ModelShape:
    cfg, title = load_model_config(spec)
    return shape_from_config(cfg, title, dtype)
