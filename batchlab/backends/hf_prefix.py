"""The step engine's prefix cache: the K/V of every cached block, copied in and out of slots.

The scheduler's pool decides which blocks are cached (schedulers/prefix_cache.py) and each Step
says what to do (`CacheOps`): drop evicted keys, copy a hit's blocks into the new request's slot
before the pass, keep a copy of each block the pass completed. So this store holds exactly the
blocks the pool holds, and a hit really skips that prefill: the request attends to copied K/V.
NOTE: slots are contiguous per request (backends/hf_slots.py), so a hit is a copy, not a shared
block as in vLLM's paged cache; the store costs up to `num_kv_blocks` blocks of K/V besides the slots.
"""
from __future__ import annotations

import torch

from batchlab.backends.hf_slots import SlotKV
from batchlab.core.work import CacheOps


class BlockStore:
    """key -> one block's K and V for every layer, `[2 * layers, kv_heads, block_size, head_dim]`."""

    def __init__(self) -> None:
        self.blocks: dict[int, torch.Tensor] = {}

    def before(self, ops: CacheOps, cache: SlotKV) -> None:
        """Drop evicted keys, then fill each hit's slot with its cached prefix."""
        for key in ops.evict:
            self.blocks.pop(key, None)
        layers = len(cache.k)
        for r, keys in ops.load:
            s, n = cache.slot(r), len(keys) * ops.block_size
            missing = [k for k in keys if k not in self.blocks]
            if missing:
                raise RuntimeError(f"prefix cache out of step: {len(missing)} block(s) of {r.request_id} not stored")
            kv = torch.stack([self.blocks[k] for k in keys])            # [nb, 2L, H, bs, D]
            kv = kv.permute(1, 2, 0, 3, 4).reshape(2 * layers, kv.shape[2], n, kv.shape[-1])
            for i in range(layers):
                cache.k[i][s, :, :n] = kv[i]
                cache.v[i][s, :, :n] = kv[layers + i]
            cache.lengths[s] = n

    def after(self, ops: CacheOps, cache: SlotKV) -> None:
        """Keep a copy of each block the pass completed (the slot will be reused)."""
        bs = ops.block_size
        for r, i, key in ops.store:
            if key not in self.blocks:
                s, span = cache.slot_of[r], slice(i * bs, (i + 1) * bs)
                self.blocks[key] = torch.stack([t[s, :, span] for t in (*cache.k, *cache.v)])
