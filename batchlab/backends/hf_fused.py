"""The step engine's forward pass: through transformers' modules, or written out for Llama-shaped
models with the projections fused.

A pass through transformers' modules on a small model is mostly dispatch: at 16 decode rows the
tiny model's step is about a quarter Python outside any torch op (benchmarks/decode_profile.py),
and each layer runs seven small matrix products (q, k, v, o, gate, up, down). `FusedPass` runs
the same computation as plain tensor code over weights gathered once: q/k/v as one product and
gate/up as one, so four products a layer, and no module calls. This is the model definition
small serving engines keep for themselves instead of calling the library's.

Exactness: every op is the one transformers runs (RMSNorm in float32, RoPE as q*cos +
rotate_half(q)*sin, SiLU(gate)*up, attention through `slot_attention`), and a fused product's
columns are the separate products' (each output is the same dot product over the same inputs).
tests/backends/test_hf_fused.py checks tokens and logits against the module path;
`supported` names what a model needs, and anything else keeps the module path (`module_pass`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from batchlab.backends.hf_slots import StepPlan, slot_attention
from batchlab.errors import ConfigError

# Llama's layer: RMSNorm before attention and MLP, q/k/v (a bias allowed, as Qwen2 has), o without
# a bias, no q/k norms, a gated SiLU MLP without biases.
ARCHITECTURES = ("llama", "mistral", "qwen2")


def supported_config(config) -> str | None:
    """What a model's config alone says (light: no weights): None if a FusedPass can run it, else
    why not (one phrase)."""
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model type {kind!r} (fused pass: {', '.join(ARCHITECTURES)})"
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "mlp_bias", False):
        return "an MLP other than a bias-free gated SiLU"
    if kind != "qwen2" and getattr(config, "attention_bias", False):
        return "an attention output bias"
    return None


def supported(model) -> str | None:
    """None if `model` can run as a FusedPass, else why not (one phrase): its config, then its
    modules (what a config may not say)."""
    why = supported_config(model.config)
    if why is not None:
        return why
    layer = model.model.layers[0]
    a, m = layer.self_attn, layer.mlp
    if any(getattr(m, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
        return "an MLP other than a bias-free gated SiLU"
    if a.o_proj.bias is not None or getattr(a, "q_norm", None) is not None:
        return "an attention output bias or query/key norms"
    return None


@dataclass(frozen=True)
class _Layer:
    attn: torch.nn.Module          # the attention module, for slot_attention (its layer_idx, scaling)
    norm1: torch.Tensor
    eps1: float
    qkv: torch.Tensor              # [(H + 2 Hkv) D, hidden]: q, k and v stacked
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    norm2: torch.Tensor
    eps2: float
    gate_up: torch.Tensor          # [2 I, hidden]: gate and up stacked
    down: torch.Tensor


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class FusedPass:
    """Logits of a StepPlan's kept rows, computed without transformers' modules."""

    def __init__(self, model):
        why = supported(model)
        if why is not None:
            raise ConfigError(refusal(why))
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.norm, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.lm_head = model.lm_head.weight
        self.layers = [self._layer(layer) for layer in inner.layers[: model.config.num_hidden_layers]]
        a = inner.layers[0].self_attn
        self.head_dim = a.head_dim
        self.split = [a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features]

    @staticmethod
    def _layer(layer) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        with torch.no_grad():
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous()
            bias = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous()
        return _Layer(a, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, qkv, bias,
                      a.o_proj.weight, layer.post_attention_layernorm.weight,
                      layer.post_attention_layernorm.variance_epsilon, gate_up, m.down_proj.weight)

    def __call__(self, plan: StepPlan) -> torch.Tensor:
        """[kept rows, vocab] logits for `plan` (its K/V written into the slot cache on the way)."""
        h = F.embedding(plan.input_ids, self.embed)                       # [T, hidden]
        T, D = h.shape[0], self.head_dim
        cos, sin = self.rotary(h[None], plan.positions[None])             # [1, T, D] each
        cos, sin = cos[0, :, None], sin[0, :, None]                       # [T, 1, D]
        for layer in self.layers:
            x = _rms(h, layer.norm1, layer.eps1)
            q, k, v = F.linear(x, layer.qkv, layer.qkv_bias).split(self.split, dim=-1)
            q = _rotate(q.view(T, -1, D), cos, sin)
            k = _rotate(k.view(T, -1, D), cos, sin)
            o, _ = slot_attention(layer.attn, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                  v.view(T, -1, D).transpose(0, 1)[None], None, scaling=layer.attn.scaling,
                                  batchlab_plan=plan)
            h = h + F.linear(o.reshape(T, -1), layer.o)
            gate, up = F.linear(_rms(h, layer.norm2, layer.eps2), layer.gate_up).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.down)
        h = _rms(h, self.norm, self.norm_eps)
        if isinstance(plan.keep, torch.Tensor):
            h = h[plan.keep]
        elif plan.keep:                                                   # transformers' int: the last n
            h = h[-plan.keep:]
        return F.linear(h, self.lm_head)


def module_pass(model):
    """A plan's kept rows' logits through the model's own modules (the engine swaps our attention
    in around the pass: hf_slots.attention)."""
    def logits(plan: StepPlan) -> torch.Tensor:
        return model(input_ids=plan.input_ids[None], position_ids=plan.positions[None], use_cache=False,
                     logits_to_keep=plan.keep, batchlab_plan=plan).logits[0]
    return logits


def refusal(why: str) -> str:
    return f"backend.fused: no fused pass for {why}; set it to false or leave it unset"


def forward_for(model, fused: bool | None, device: torch.device):
    """The engine's pass. fused None: the fused one where the model supports it on a CPU (its
    tokens are checked identical there; a GPU's matrix kernels may pick another reduction order
    for the wider fused product); True: the fused one (ConfigError naming what the model lacks);
    False: the modules."""
    if fused is None:
        fused = device.type == "cpu" and supported(model) is None
    return FusedPass(model) if fused else module_pass(model)
