"""Presets of the step-time model (backends/cost.py): coefficients from a model shape and a device.

For a memory-bound decode the model is the seed's t_step(B) ~ (W_bytes + B*T*c_kv) / BW: the
weights are read once per step whatever the batch, every row's KV is read, prompt tokens cost
compute. A preset derives the coefficients with stated efficiencies; `toy` sets them directly
(the seed toy simulator's constants). A measured profile (calibrate/profile.py) is the same
`StepCost`, saved as JSON.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batchlab.backends.cost import StepCost
from batchlab.errors import ConfigError

GB = 1e9
GiB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    params: float                 # parameter count
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Device:
    name: str
    mem_bw: float                 # bytes/s, peak
    flops: float                  # dense fp16 FLOP/s, peak
    memory_bytes: float


def derive(name: str, model: ModelShape, dev: Device, *, bw_eff: float = 0.8, flops_eff: float = 0.5,
           overhead_s: float = 1e-3, reserve_frac: float = 0.1) -> StepCost:
    """Roofline-style coefficients: reads at bw_eff x peak bandwidth, math at flops_eff x peak."""
    w_bytes = model.params * model.dtype_bytes
    bw = dev.mem_bw * bw_eff
    flop_s = dev.flops * flops_eff
    return StepCost(
        overhead_s=overhead_s,
        weight_s=w_bytes / bw,
        kv_s_per_token=model.kv_bytes_per_token / bw,
        prefill_s_per_token=2 * model.params / flop_s,
        decode_s_per_row=2 * model.params / dev.flops,   # NOTE: small matmuls overlap the weight reads; charge them at peak
        kv_bytes_per_token=model.kv_bytes_per_token,
        kv_budget_bytes=int(dev.memory_bytes * (1 - reserve_frac) - w_bytes),
        name=name,
        description=f"{name}: {model.params / 1e9:.2f}B params, {dev.name}",
    )


LLAMA2_7B = ModelShape(6.74e9, layers=32, kv_heads=32, head_dim=128)
MISTRAL_7B = ModelShape(7.24e9, layers=32, kv_heads=8, head_dim=128)
TINYLLAMA = ModelShape(1.1e9, layers=22, kv_heads=4, head_dim=64)
A100_80G = Device("A100-80GB", mem_bw=2.0e12, flops=312e12, memory_bytes=80 * GB)
RTX_3090 = Device("RTX 3090 (24 GB)", mem_bw=936e9, flops=71e12, memory_bytes=24 * GB)


def _toy() -> StepCost:
    # The seed toy's constants: 0.5 ms per decode token, 0.04 ms per prefill token,
    # 0.2 ms per step, 1800 KV blocks of 16 tokens (budget expressed at 1 byte per token).
    return StepCost(2e-4, 0.0, 0.0, 4e-5, 5e-4, kv_bytes_per_token=1, kv_budget_bytes=1800 * 16,
                    name="toy", description="linear: the seed toy simulator's cost constants")


PRESETS = {
    "llama2-7b-a100": lambda: derive("llama2-7b-a100", LLAMA2_7B, A100_80G),
    "mistral-7b-a100": lambda: derive("mistral-7b-a100", MISTRAL_7B, A100_80G),
    "tinyllama-3090": lambda: derive("tinyllama-3090", TINYLLAMA, RTX_3090),
    "toy": _toy,
}


# Token ids a prompt may use on the simulator (it runs no tokenizer, but a server over it checks
# prompt ids as a real model's would): the vocabulary of the model each preset describes.
DEFAULT_VOCAB_SIZE = 32000        # Llama's SentencePiece vocabulary: toy, and profiles that name none
VOCAB_SIZES = {"llama2-7b-a100": 32000, "mistral-7b-a100": 32768, "tinyllama-3090": 32000, "toy": 32000}


def load_vocab_size(preset: str, profile: str | None = None) -> int:
    """The preset's vocabulary size; a profile's `vocab_size` key if it has one, else 32000."""
    if not profile:
        return VOCAB_SIZES.get(preset, DEFAULT_VOCAB_SIZE)
    try:
        value = json.loads(Path(profile).read_text()).get("vocab_size", DEFAULT_VOCAB_SIZE)
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise ConfigError(f"{profile}: not a batchlab profile: {e}") from None
    if type(value) is not int or value < 1:
        raise ConfigError(f"{profile}: vocab_size must be a positive integer (got {value!r})")
    return value


def load_cost(preset: str, profile: str | None = None) -> StepCost:
    if profile:
        return StepCost.from_json(profile)
    if preset not in PRESETS:
        raise ConfigError(f"backend.preset: unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    return PRESETS[preset]()
