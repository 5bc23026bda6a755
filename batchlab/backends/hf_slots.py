"""The slot KV cache and the attention function that reads it (used by backends/hf_engine.py).

One slot per request holds its keys and values, `[slots, kv_heads, capacity, head_dim]` per
layer, so a request's cached prefix is a plain slice: no gather, no copy of the cache per step.
`slot_attention` is registered with transformers' AttentionInterface and swapped in for one
forward pass at a time (`attention`): it writes the pass's K/V into the slots, then attends all
single-token rows in one batched SDPA call over the slot range and each multi-token row alone.
"""
from __future__ import annotations

import contextlib
import heapq
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from batchlab.core.request import Request

ATTN_NAME = "batchlab_slots"


class SlotKV:
    """Per-layer K/V tensors indexed by slot; grows (by doubling) in slots and in capacity."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype, device):
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.slots = self.capacity = 0
        self.lengths: list[int] = []           # tokens cached per slot
        self._free: list[int] = []             # heap: lowest free slot first keeps the range dense
        self.slot_of: dict[Request, int] = {}
        self.generation = 0                    # bumped when the tensors are reallocated

    def slot(self, r: Request) -> int:
        s = self.slot_of.get(r)
        if s is None:
            if not self._free:
                self._grow(max(8, 2 * self.slots), self.capacity)
            s = self.slot_of[r] = heapq.heappop(self._free)
        return s

    def release(self, r: Request) -> None:
        """Free r's slot. NOTE: the held slots stay exactly 0..n-1: the highest one moves into
        the hole (a copy of its cached tokens), so a decode pass over every running request is
        dense (no scatter) and can run at a bucketed shape (backends/hf_compile.py)."""
        s = self.slot_of.pop(r, None)
        if s is None:
            return
        last = max(self.slot_of.values(), default=-1)
        if last > s:
            mover = next(q for q, t in self.slot_of.items() if t == last)
            n = self.lengths[last]
            with torch.inference_mode():
                for kv in (self.k, self.v):
                    for t in kv:
                        t[s, :, :n] = t[last, :, :n]
            self.slot_of[mover], self.lengths[s] = s, n
            s = last
        self.lengths[s] = 0
        heapq.heappush(self._free, s)

    def ensure_slots(self, n: int) -> None:
        """At least n slots (padding rows of a bucketed decode pass write into free ones)."""
        if n > self.slots:
            self._grow(max(n, 2 * self.slots), self.capacity)

    def reserve(self, tokens: int) -> None:
        if tokens > self.capacity:
            self._grow(self.slots, max(tokens, 2 * self.capacity, 64))

    @property
    def used_range(self) -> int:
        """Slots 0..n-1 cover every request that holds a slot."""
        return max(self.slot_of.values(), default=-1) + 1

    def _grow(self, slots: int, capacity: int) -> None:
        layers, heads, dim = self.shape
        # NOTE: zeros, not empty: masked-out positions must hold finite values (0 * NaN is NaN).
        new = lambda: torch.zeros(slots, heads, capacity, dim, dtype=self.dtype, device=self.device)
        for kv in (self.k, self.v):
            for i in range(layers):
                t = new()
                if kv[i:i + 1]:
                    t[: self.slots, :, : self.capacity] = kv[i]
                    kv[i] = t
                else:
                    kv.append(t)
        for s in range(self.slots, slots):
            heapq.heappush(self._free, s)
        self.lengths += [0] * (slots - self.slots)
        self.slots, self.capacity = slots, capacity
        self.generation += 1


@dataclass(slots=True)
class StepPlan:
    """Everything one forward pass needs, built once per step and shared by every layer."""
    cache: SlotKV
    input_ids: torch.Tensor                # [T] packed tokens: single-token rows first, by slot
    positions: torch.Tensor                # [T]
    write_slot: torch.Tensor               # [T] where each token's K/V goes
    write_pos: torch.Tensor                # [T]
    single_slots: torch.Tensor | None      # [R1] slots of single-token rows, in packed order
    single_mask: torch.Tensor | None       # [S, 1, 1, L] additive (0 / -inf): valid keys per slot 0..S-1
    single_dense: bool                     # the single rows are exactly slots 0..S-1: no scatter
    multi: list[tuple[int, int, int, int, torch.Tensor]] = field(default_factory=list)  # slot, start, n, ctx, mask
    keep: torch.Tensor | int = 0           # packed indices whose logits make new tokens; 0: all of them
    emit: list[Request] = field(default_factory=list)
    pad: int = 0                           # padding rows after the real ones (hf_compile.pad_rows)


@contextlib.contextmanager
def attention(model, name: str):
    """Route the model's attention through `name` for one forward pass, then restore it.

    NOTE: swapped per pass rather than set for good, so request-level `generate()` on the same
    model keeps its own attention and mask. Custom names have no mask function, so
    transformers builds no causal mask for our packed row (our function masks by slot)."""
    cfg = model.config
    old = cfg._attn_implementation_internal
    cfg._attn_implementation_internal = name
    try:
        yield
    finally:
        cfg._attn_implementation_internal = old


def slot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface function: write this step's K/V into the slots, attend per request.

    `query` is [1, H, T, D], `key`/`value` [1, Hkv, T, D] (RoPE applied at each token's own
    position). Grouped-query heads are folded into query rows ([Hkv, G * rows, D]), which is
    exactly what repeating the K/V heads computes, without copying them.
    NOTE: masks are additive floats built once per pass (SDPA would convert a bool mask in every
    layer), and every call is 4-D: a 3-D call falls back to torch's slower math kernel on CPU."""
    plan: StepPlan = kwargs["batchlab_plan"]
    k_cache, v_cache = plan.cache.k[module.layer_idx], plan.cache.v[module.layer_idx]
    k_cache[plan.write_slot, :, plan.write_pos] = key[0].transpose(0, 1)
    v_cache[plan.write_slot, :, plan.write_pos] = value[0].transpose(0, 1)
    q = query[0].transpose(0, 1)                            # [T, H, D]
    _, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    outs = []
    if plan.single_slots is not None:
        mask = plan.single_mask
        S, L = mask.shape[0], mask.shape[-1]
        rows = len(plan.single_slots)
        if plan.single_dense:                  # common case: every slot decodes, in slot order
            q_all = q[:rows]
        else:                                  # other slots get a dummy query, dropped below
            q_all = q.new_zeros(S, heads, dim).index_copy_(0, plan.single_slots, q[:rows])
        o = F.scaled_dot_product_attention(q_all.reshape(S, kv_heads, -1, dim), k_cache[:S, :, :L],
                                           v_cache[:S, :, :L], attn_mask=mask, scale=scaling)
        o = o.reshape(S, heads, dim)
        outs.append(o if plan.single_dense else o.index_select(0, plan.single_slots))
    for slot, start, n, ctx, mask in plan.multi:
        qm = q[start:start + n].permute(1, 0, 2).reshape(1, kv_heads, -1, dim)   # [1, Hkv, G*n, D]
        o = F.scaled_dot_product_attention(qm, k_cache[slot:slot + 1, :, :ctx], v_cache[slot:slot + 1, :, :ctx],
                                           attn_mask=mask, scale=scaling)
        outs.append(o.reshape(heads, n, dim).transpose(0, 1))
    return (outs[0] if len(outs) == 1 else torch.cat(outs, 0))[None], None
