"""Prompt token ids for traffic whose prompts share content (system prompts, conversations,
Mooncake hash ids), the same on every backend, the simulator included.

A prompt is described by segments (key, tokens). A segment's ids are a counter-based hash of
its key and the position, so equal keys give equal ids and a shorter segment with the same key
is a prefix of a longer one (a Mooncake trace's last, partial block); different keys collide
with probability about 1 / span per token, i.e. never for a whole cache block. Ids avoid both
ends of a vocabulary, where tokenizers keep their special tokens.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

Segment = tuple[tuple, int]     # (key: a tuple of ints and strings, tokens)

FIRST_ID = 10                   # below: <unk>, <s>, </s>, <pad>, ... in common tokenizers
LAST_ID = 32_000                # at most: Llama 3, Qwen, ... keep their special tokens far above this
UNKNOWN_VOCAB = 1_100           # a backend that does not know its vocabulary (a server): 10..1099,
                                # which any model the size of the tiny one (3,000 ids) or larger has


def id_range(vocab: int | None) -> tuple[int, int]:
    """[low, high) of the ids a prompt may use with a backend of `vocab` token ids (None: unknown)."""
    high = min(vocab, LAST_ID) if vocab else UNKNOWN_VOCAB
    if high <= FIRST_ID + 1:
        raise ValueError(f"a vocabulary of {vocab} token ids leaves none for synthetic prompts")
    return FIRST_ID, high


def token_ids(segments: tuple[Segment, ...], vocab: int | None) -> list[int]:
    """The prompt the segments describe, as a list of ids within `id_range(vocab)`."""
    parts = [segment_ids(key, n, vocab) for key, n in segments]
    return np.concatenate(parts).tolist() if parts else []


@lru_cache(maxsize=4096)        # shared system prompts come back on every request of their group
def segment_ids(key: tuple, n: int, vocab: int | None) -> np.ndarray:
    low, high = id_range(vocab)
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    x = np.uint64(int.from_bytes(digest, "little")) + np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    ids = low + (_splitmix64(x) % np.uint64(high - low)).astype(np.int64)
    ids.flags.writeable = False  # cached: shared by every caller
    return ids


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A 64-bit mixer (Steele et al.): consecutive counters give independent-looking values.
    NOTE: uint64 arithmetic on arrays wraps modulo 2^64, which is what the mixer needs."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def ideal_prefix_hits(prompts: list[list[int]], block_size: int) -> tuple[int, int]:
    """(full blocks found cached, full blocks in all prompts) for an unbounded prefix cache that
    sees the prompts in this order: block j of a prompt is a hit when an earlier prompt had the
    same first (j + 1) x block_size tokens (blocks keyed by their content and everything before
    it, as vLLM's automatic prefix caching keys them). The reference a real cache is held to; it
    never evicts and it counts a fully cached prompt in full (vLLM recomputes its last token)."""
    seen: set[int] = set()
    hits = total = 0
    for ids in prompts:
        parent = 0
        for j in range(len(ids) // block_size):
            parent = hash((parent, tuple(ids[j * block_size:(j + 1) * block_size])))
            total += 1
            if parent in seen:
                hits += 1
            else:
                seen.add(parent)
    return hits, total
