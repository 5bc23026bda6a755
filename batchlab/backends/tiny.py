"""A tiny random Llama, built locally in seconds, so tests and CPU runs exercise the real HF path.

No model hub is reachable from the machines this project runs on, so we make our own model: a
byte-level BPE tokenizer trained with `tokenizers` on seeded pseudo-English generated here, and a
randomly initialised `LlamaForCausalLM` (hidden 256, 4 layers, ~4.7 M parameters). Both are saved
with `save_pretrained`, so loading goes through `AutoModelForCausalLM`/`AutoTokenizer` exactly like
any real checkpoint. Its outputs are gibberish; its shapes, cache and timings are real.
`backend.model: tiny` in a config means "the cached copy of this model" (see `resolve_model`).

`tiny-text` is the same model that never emits a token with no text of its own: special tokens and
byte tokens that are not a whole character. A server that streams text (transformers serve)
decodes tokens incrementally and sends nothing for such a token, so its text arrives with the next
token's, in one chunk, and chunk gaps stop being step times. A trained model rarely emits them on
ordinary text; greedy decoding on random weights falls into loops that do. Their rows of the
output layer are zero, so their logit is 0 where the best of the other random logits lies
above it: argmax never picks them, and the weights' shapes, and so every step's cost, stay
the same.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

TINY_ALIAS = "tiny"
TEXT_ALIAS = "tiny-text"              # the same model, every output token streaming text of its own
MARKER = "batchlab_tiny.json"        # written last: its presence means the build completed
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]


@dataclass(frozen=True)
class TinySpec:
    vocab_size: int = 3000            # BPE target vocabulary (256 bytes + merges + specials)
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2             # grouped-query attention, like most current models
    max_position_embeddings: int = 4096  # tokens of context
    corpus_words: int = 120_000       # words of generated training text
    seed: int = 0
    format: int = 2                   # bump when the build changes, so cached copies are rebuilt


def data_dir() -> Path:
    """Where generated artefacts are cached: $BATCHLAB_DATA, else <repo>/.data."""
    env = os.environ.get("BATCHLAB_DATA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    return (repo if (repo / "pyproject.toml").is_file() else Path.cwd()) / ".data"


def resolve_model(name: str | None) -> str:
    """Map the `tiny` alias (or an unset model) to the cached tiny model's directory, and
    `tiny-text` to its text-streaming copy's."""
    if name in (None, "", TINY_ALIAS):
        return str(ensure_tiny_model())
    if name == TEXT_ALIAS:
        return str(ensure_tiny_model(data_dir() / "tiny-llama-text", text_tokens_only=True))
    return name


def ensure_tiny_model(path: str | Path | None = None, spec: TinySpec = TinySpec(), text_tokens_only: bool = False) -> Path:
    """Build the tiny model once (default: <data dir>/tiny-llama) and return its directory;
    `text_tokens_only`: the tiny-text copy (module docstring).

    NOTE: several processes (parallel test runs) may ask at once. Each builds into its own
    temporary directory and renames it into place; a loser of the race keeps the winner's copy.
    """
    target = Path(path) if path is not None else data_dir() / "tiny-llama"
    if _is_built(target, spec, text_tokens_only):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=target.parent))
    try:
        make_tiny_model(tmp, spec, text_tokens_only)
        if target.exists() and not _is_built(target, spec, text_tokens_only):
            shutil.rmtree(target, ignore_errors=True)     # stale or half-written: replace it
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_built(target, spec, text_tokens_only):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _marker(spec: TinySpec, text_tokens_only: bool) -> dict:
    return asdict(spec) | ({"text_tokens_only": True} if text_tokens_only else {})


def _is_built(path: Path, spec: TinySpec, text_tokens_only: bool = False) -> bool:
    marker = path / MARKER
    try:
        return json.loads(marker.read_text()) == _marker(spec, text_tokens_only)
    except (OSError, ValueError):
        return False


def make_tiny_model(path: str | Path, spec: TinySpec = TinySpec(), text_tokens_only: bool = False) -> Path:
    """Train the tokenizer, build the random model, save both under `path` (deterministic);
    `text_tokens_only`: with the output rows of silent_tokens zeroed (module docstring)."""
    import torch
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(corpus(spec.corpus_words, spec.seed), spec)
    tokenizer.save_pretrained(path)
    with torch.random.fork_rng(devices=[]):          # leave the caller's RNG state alone
        torch.manual_seed(spec.seed)
        model = _build_model(spec, tokenizer)
    if text_tokens_only:
        with torch.no_grad():
            model.lm_head.weight[silent_tokens(tokenizer)] = 0.0
    model.save_pretrained(path)
    (path / MARKER).write_text(json.dumps(_marker(spec, text_tokens_only)))
    return path


def silent_tokens(tokenizer) -> list[int]:
    """The ids that decode to no whole text on their own, as a streaming server decodes a token:
    special tokens, and byte tokens that are part of a character."""
    from tokenizers.decoders import DecodeStream
    out = []
    for i in range(len(tokenizer)):
        text = DecodeStream([], skip_special_tokens=True).step(tokenizer._tokenizer, i)
        if not text or "\ufffd" in text:
            out.append(i)
    return out


def corpus(n_words: int, seed: int) -> list[str]:
    """Seeded pseudo-English: syllable-built words with a Zipf-like frequency, in sentences.

    NOTE: generated rather than shipped, so the build needs no data file and no download; the
    Zipf skew gives BPE frequent whole words and rare long ones, like natural text.
    """
    rng = np.random.default_rng(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "st", "tr", "pl", "ch", "sh", "th", "br", "gr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck"]
    n_lex = 6000
    syllables = rng.integers(1, 4, size=n_lex)
    parts = np.stack([rng.integers(0, len(x), size=(n_lex, 3)) for x in (onsets, vowels, codas)], -1)
    lexicon = ["".join(onsets[o] + vowels[v] + codas[c] for o, v, c in parts[w, :syllables[w]])
               for w in range(n_lex)]
    weights = 1.0 / np.arange(1, len(lexicon) + 1)
    words = rng.choice(lexicon, size=n_words, p=weights / weights.sum())
    lines, i = [], 0
    while i < n_words:
        n = int(rng.integers(4, 18))
        sentence = " ".join(words[i:i + n])
        number = f" {int(rng.integers(0, 2000))}" if rng.random() < 0.1 else ""
        lines.append(sentence.capitalize() + number + rng.choice([".", ".", "?", "!", ","]))
        i += n
    return lines


def _train_tokenizer(lines: list[str], spec: TinySpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", padding_side="left",
                                   model_max_length=spec.max_position_embeddings)


def _build_model(spec: TinySpec, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()
