"""Presets of the step-time model (backends/cost.py): coefficients from a model shape and a device.

For a memory-bound decode the model is t_step(B) ~ (W_bytes + B*T*c_kv) / BW: the
weights are read once per step whatever the batch, every row's KV is read, prompt tokens cost
compute. A preset derives the coefficients with stated efficiencies; `toy` sets them directly
(a linear toy model's constants, kept for the four-mode comparison). A measured profile (calibrate/profile.py) is the same
`StepCost`, saved as JSON.
Every preset says what kind it is (`kind`, shown in setup.json and the report): a roofline
estimate from datasheet numbers, or measured. A profile JSON dropped into
batchlab/data/presets/<name>.json becomes preset <name> of kind "measured" beside the rooflines.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from batchlab.backends.cost import COEFFS, StepCost
from batchlab.backends.gpus import GB, GPU
from batchlab.backends.model_shape import ModelShape
from batchlab.backends.roofline import ROOFLINE, roofline
from batchlab.errors import ConfigError

GiB = 1024**3
MEASURED, TOY = "measured", "toy constants"     # a preset's kind (ROOFLINE: backends/roofline.py)


def derive(name: str, model: ModelShape, dev: GPU) -> StepCost:
    """A preset's roofline (backends/roofline.py, one GPU), described as presets always were."""
    cost = roofline(model, dev, 1, name=name)
    return replace(cost, description=f"{name}: {model.params / 1e9:.2f}B params, {dev.name}, {ROOFLINE}")


# The presets' own shapes and devices, with the figures they have always used (rounded datasheet
# numbers; the sizing catalog, backends/gpus.py, carries the exact ones), so their results stay put.
LLAMA2_7B = ModelShape(6.74e9, layers=32, kv_heads=32, head_dim=128)
MISTRAL_7B = ModelShape(7.24e9, layers=32, kv_heads=8, head_dim=128)
TINYLLAMA = ModelShape(1.1e9, layers=22, kv_heads=4, head_dim=64)
A100_80G = GPU("A100-80GB", 80 * GB, 2.0e12, 312e12, 300 * GB, "NVLink 3", 0.0)
RTX_3090 = GPU("RTX 3090 (24 GB)", 24 * GB, 936e9, 71e12, 32 * GB, "PCIe Gen4 x16", 0.0)
H200 = GPU("H200 (141 GB)", 141 * GB, 4.8e12, 989e12, 450 * GB, "NVLink 4", 0.0)   # SXM datasheet, dense fp16


def _toy() -> StepCost:
    # A linear toy model: 0.5 ms per decode token, 0.04 ms per prefill token,
    # 0.2 ms per step, 1800 KV blocks of 16 tokens (budget expressed at 1 byte per token).
    return StepCost(2e-4, 0.0, 0.0, 4e-5, 5e-4, kv_bytes_per_token=1, kv_budget_bytes=1800 * 16,
                    name="toy", description="linear: toy constants (0.2 ms per step, 0.04 ms per prompt token, 0.5 ms per decode row)")


MEASURED_DIR = Path(__file__).resolve().parents[1] / "data" / "presets"
# Token ids a prompt may use on the simulator (it runs no tokenizer, but a server over it checks
# prompt ids as a real model's would): the vocabulary of the model each preset describes.
DEFAULT_VOCAB_SIZE = 32000        # Llama's SentencePiece vocabulary: toy, and profiles that name none


@dataclass(frozen=True)
class Preset:
    build: Callable[[], StepCost]
    kind: str                     # ROOFLINE (datasheet numbers x stated efficiencies), MEASURED or TOY
    vocab_size: int = DEFAULT_VOCAB_SIZE
    source: str = ""              # measured: the profile file it was read from


def _roofline(name: str, model: ModelShape, dev: GPU, vocab: int) -> Preset:
    return Preset(lambda: derive(name, model, dev), ROOFLINE, vocab)


def measured_presets(directory: Path = MEASURED_DIR) -> dict[str, Preset]:
    """Every profile JSON in `directory` (`batchlab profile --out` output, renamed to the preset's
    name) as a measured preset. NOTE: read at import; an unreadable file is refused by load_cost."""
    out = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            vocab = int(json.loads(path.read_text()).get("vocab_size", DEFAULT_VOCAB_SIZE))
        except (OSError, ValueError, AttributeError, TypeError):
            vocab = DEFAULT_VOCAB_SIZE
        out[path.stem] = Preset(lambda p=path: _named(StepCost.from_json(p), p.stem), MEASURED, vocab, str(path))
    return out


def _named(cost: StepCost, name: str) -> StepCost:
    return replace(cost, name=name, description=f"{name}: {cost.description or 'a measured profile'}; {MEASURED}")


PRESETS: dict[str, Preset] = {
    "llama2-7b-a100": _roofline("llama2-7b-a100", LLAMA2_7B, A100_80G, 32000),
    "mistral-7b-a100": _roofline("mistral-7b-a100", MISTRAL_7B, A100_80G, 32768),
    "mistral-7b-h200": _roofline("mistral-7b-h200", MISTRAL_7B, H200, 32768),
    "tinyllama-3090": _roofline("tinyllama-3090", TINYLLAMA, RTX_3090, 32000),
    "toy": Preset(_toy, TOY),
    **measured_presets(),
}
VOCAB_SIZES = {name: p.vocab_size for name, p in PRESETS.items()}


def preset_kind(cost: StepCost) -> str:
    """What a cost is, for setup.json and the report: a preset's kind, else a measured profile."""
    p = PRESETS.get(cost.name)
    return p.kind if p is not None else f"{MEASURED} (profile)"


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
    return PRESETS[preset].build()


def check_cost(preset: str, profile: str | None = None) -> StepCost:
    """The step-time model a run will use, refused in one line unless every number is usable."""
    cost = load_cost(preset, profile)
    for f in fields(cost):
        v = getattr(cost, f.name)
        if f.type in ("float", "int") and not (isinstance(v, int | float) and not isinstance(v, bool)
                                               and math.isfinite(v) and v >= 0):
            raise ConfigError(f"{profile}: {f.name} must be a finite number >= 0 (got {v!r})")
    if cost.kv_bytes_per_token <= 0:
        raise ConfigError(f"{profile}: kv_bytes_per_token must be > 0 (got {cost.kv_bytes_per_token!r})")
    return cost


def term_ratios(estimate: StepCost, measured: StepCost) -> dict[str, dict[str, float | None]]:
    """Each step-time term, estimated and measured, and measured / estimated (None where the
    estimate is 0). NOTE: a fit cannot tell per-step overhead from the weight read (cost.py), so
    the two are compared as their sum, `fixed_s`."""
    terms = {"fixed_s": (estimate.fixed_s, measured.fixed_s)}
    for k in COEFFS[1:]:            # every fitted term, the later ones (attention, admission, warm-up) too
        terms[k] = (getattr(estimate, k), getattr(measured, k))
    return {k: {"estimate": e, "measured": m, "ratio": (m / e if e else None)} for k, (e, m) in terms.items()}
