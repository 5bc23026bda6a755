"""Real shapes, random weights: `backend.model: random:<shape>` builds a published architecture
from a bundled config (batchlab/data/shapes/<shape>.json) with random weights, with no download.

Timing does not depend on weight values: a model of a real shape runs exactly the FLOPs and bytes
of the trained one (its greedy outputs are nonsense, and batchlab forces every output length). So
the 7B experiments run where no model hub is reachable. The model is built on the meta device
(no memory), moved with `to_empty` onto the target device in the target dtype, and filled in
place there: no fp32 copy is ever made, and a 7B model builds in seconds on a GPU.
Its label says "random weights" wherever a model name is shown (CSV, setup, report, console).
No torch at import: preflight (backends/hf_hub.py) checks names with `check_name` alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from batchlab.backends.model_shape import PREFIX, bundled

SPECIALS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>"}


@dataclass(frozen=True)
class Shape:
    name: str                      # as in `random:<name>`
    title: str                     # the published model this shape copies
    config: dict[str, Any]         # a transformers config (model_type + its fields)
    published_params: int | None   # the trained model's parameter count, where there is one

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])


def is_random(name: str | None) -> bool:
    return bool(name) and name.startswith(PREFIX)


@cache
def shape(name: str) -> Shape:
    """`random:<shape>` (or the bare shape name) -> its bundled Shape; ConfigError naming the known ones."""
    key = name.removeprefix(PREFIX)
    data = bundled(key, "backend.model")
    return Shape(key, data["title"], data["config"], data.get("published_params"))


def check_name(name: str) -> list[str]:
    """Preflight: the shape must be bundled. No hub, no torch."""
    shape(name)
    return []


def label(name: str) -> str:
    """What a random model is called in every output: never mistaken for the trained model."""
    return f"{PREFIX}{shape(name).name} (random weights)"


def config_of(name: str):
    """The transformers config of the shape."""
    from transformers import AutoConfig
    fields = dict(shape(name).config)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def build_on_meta(name: str, dtype=None):
    """The model with every tensor on the meta device: shapes and counts, no memory."""
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config_of(name), dtype=dtype or torch.float16)


def build(name: str, device, dtype, seed: int = 0):
    """(model, tokenizer): the shape on `device` in `dtype`, random weights, in eval mode.

    NOTE: meta first, then `to_empty` allocates straight on the device in the target dtype and
    each tensor is filled there (normal(0, initializer_range) for matrices, ones for norms): the
    same statistics as transformers' own init, without its CPU fp32 pass over 7B weights.
    Rotary embeddings keep their frequencies in non-persistent buffers that `to_empty` leaves
    uninitialised, so those modules are rebuilt on the device from the config.
    """
    import torch
    model = build_on_meta(name, dtype).to_empty(device=device)
    std = float(shape(name).config.get("initializer_range", 0.02))
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std, generator=gen)
            elif pname.endswith("bias"):
                p.zero_()
            else:                                  # RMSNorm / LayerNorm scales
                p.fill_(1.0)
        _rebuild_rotary(model, device)
    model.tie_weights()
    return model.eval(), tokenizer_for(name)


def _rebuild_rotary(model, device) -> None:
    import torch
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding"):
                with torch.device(device):
                    setattr(parent, child_name, type(child)(child.config))


def tokenizer_for(name: str):
    """A tokenizer whose vocabulary is exactly the shape's `vocab_size`, built in well under a second.

    NOTE: training a 32k/128k BPE would take minutes and buys nothing: the weights are random, so
    which string an id stands for does not matter, only that every id exists. So: byte-level BPE
    with no merges (any text encodes, one token per byte, nothing is unknown), the three special
    tokens at the ids the config names, and filler tokens `t<id>` for every other id (they
    decode, and are only ever produced by the model).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    s = shape(name)
    cfg = s.config
    at = {cfg.get("bos_token_id", 1): SPECIALS["bos"], cfg.get("eos_token_id", 2): SPECIALS["eos"]}
    at.setdefault(0, SPECIALS["unk"])
    byte_chars = iter(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for i in range(s.vocab_size):
        if i in at:
            vocab[at[i]] = i
        else:
            vocab[next(byte_chars, None) or f"t{i}"] = i
    if len(vocab) != s.vocab_size or "<unk>" not in vocab:
        raise ValueError(f"random shape {s.name}: vocab_size {s.vocab_size} is too small for 256 bytes + specials")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   padding_side="left", model_max_length=int(cfg["max_position_embeddings"]))
