"""Output tokens to text: the incremental decoder must give, piece by piece, exactly what decoding
the whole output again at every token gave (the rule a client's text is checked against)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from batchlab.server.text import PLACEHOLDER, TextCodec


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _whole_again(tok, ids: list[int]) -> list[str]:
    """The reference: the whole output decoded at every token; a token that ends inside a
    character adds nothing until the character is complete."""
    out, text = [], ""
    for k in range(len(ids)):
        full = tok.decode(ids[: k + 1], skip_special_tokens=True)
        if full.endswith("\ufffd"):
            out.append("")
            continue
        out.append(full[len(text):])
        text = full
    return out


def test_the_tiny_models_tokenizer_decodes_incrementally(tokenizer):
    assert TextCodec(tokenizer)._streams


def test_pieces_match_decoding_the_whole_output_for_any_ids_in_any_slices(tokenizer):
    """Random ids (special tokens and bytes that split characters included), handed over in
    slices of 1 to 3 tokens, as a stream's wake-ups do."""
    rng = random.Random(7)
    codec = TextCodec(tokenizer)
    for _ in range(200):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 50))]
        r, state, pieces, k = SimpleNamespace(output_token_ids=ids), {}, [], 0
        while k < len(ids):
            end = min(len(ids), k + rng.randrange(1, 4))
            pieces += codec.delta(r, k, end, state)
            k = end
        assert pieces == _whole_again(tokenizer, ids)


def test_without_a_tokenizer_each_token_is_a_placeholder_word():
    r = SimpleNamespace(output_token_ids=[])
    assert TextCodec().delta(r, 0, 3, {}) == [" " + w for w in PLACEHOLDER[:3]]
