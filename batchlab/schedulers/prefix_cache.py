"""Automatic prefix caching over the KV blocks (vLLM's scheme), as bookkeeping only.

A full block of prompt tokens is keyed by hash(parent block's key, its token ids), so a key names
the block's content and everything before it. Blocks carry reference counts: requests with the
same prefix share one block. A block whose count drops to zero keeps its key and waits, least
recently used first, until an allocation needs it (then its key is evicted). An arriving request
reuses the longest run of cached blocks from its start and computes only the rest, but always at
least its last prompt token, so the first output token has logits (vLLM does the same).
Which tensors hold the KV is the backend's business: `cache_ops()` tells a backend that keeps KV
itself (the HF step engine) what to load, store and drop, so it holds exactly what this pool says.
"""
from __future__ import annotations

from collections import OrderedDict

from batchlab.core.request import Request
from batchlab.core.work import CacheOps, Step
from batchlab.schedulers.kv_blocks import BlockPool

ROOT = 0        # the parent key of a prompt's first block


def block_hashes(token_ids: list[int] | None, block_size: int, limit: int | None = None) -> list[int]:
    """Chained keys of the full blocks of `token_ids` (at most `limit` tokens of it).
    NOTE: Python's hash of a tuple of ints is deterministic across runs (PYTHONHASHSEED only
    salts str and bytes) and 64-bit; a collision would need ~2^32 distinct blocks in one cache."""
    if not token_ids:
        return []
    n = len(token_ids) if limit is None else min(limit, len(token_ids))
    keys, parent = [], ROOT
    for start in range(0, n - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + block_size])))
        keys.append(parent)
    return keys


class PrefixBlockPool(BlockPool):
    """A BlockPool whose blocks have identities, reference counts and content keys.
    `held` keeps the per-request block count the scheduler's hot path reads; `tables` the ids."""

    def __init__(self, num_blocks: int, block_size: int, reserve: bool = False):
        super().__init__(num_blocks, block_size, reserve)
        self.tables: dict[Request, list[int]] = {}          # block ids per running request, in order
        self.refs = [0] * num_blocks
        self.key_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}                    # key -> block id
        self.empty = list(range(num_blocks - 1, -1, -1))    # free blocks without a key (stack)
        self.evictable: OrderedDict[int, None] = OrderedDict()   # free keyed blocks, LRU first
        self._keys: dict[Request, list[int]] = {}           # memo: a request's prompt block keys
        self._loads: list[tuple[Request, list[int]]] = []
        self._evicted: list[int] = []

    # -- queries ---------------------------------------------------------------------------------
    @property
    def spare(self) -> int:
        """Free blocks holding no cached prefix. NOTE: a decode window books only these: booking
        ahead must not evict a prefix that stepping one at a time would still have cached when
        the window is cut short (blocks come back, evicted keys do not)."""
        return len(self.empty)

    def keys(self, r: Request, remember: bool = True) -> list[int]:
        """r's prompt block keys, memoized while r is waiting or running here (`release` forgets)."""
        k = self._keys.get(r)
        if k is None:
            k = block_hashes(r.prompt_token_ids, self.block_size, r.prompt_len)
            if remember:
                self._keys[r] = k
        return k

    def hit_blocks(self, keys: list[int], max_blocks: int) -> int:
        """How many of `keys`, from the first, are cached (at most `max_blocks`)."""
        n = 0
        for k in keys[:max_blocks]:
            if k not in self.cached:
                break
            n += 1
        return n

    def cached_tokens(self, r: Request, remember: bool = True) -> int:
        """Tokens of r's prompt a fresh admission would reuse: whole blocks, never its last token.
        `remember=False` for a look from outside (a router asking every replica)."""
        return self.hit_blocks(self.keys(r, remember), (r.num_tokens - 1) // self.block_size) * self.block_size

    # -- booking ---------------------------------------------------------------------------------
    def grow(self, r: Request, tokens: int) -> bool:
        table = self.tables.get(r)
        if table is None:
            return self._admit(r, tokens)
        extra = self.blocks_for(r, tokens) - len(table)
        if extra > self.free:
            return False
        for _ in range(extra):
            table.append(self._allocate())
        self.held[r] = len(table)
        return True

    def _admit(self, r: Request, tokens: int) -> bool:
        """First booking of r: claim its cached prefix blocks, then allocate the rest, or
        (if the free blocks do not cover both) book nothing."""
        keys = self.keys(r)
        hits = [self.cached[k] for k in keys[:self.hit_blocks(keys, (r.num_tokens - 1) // self.block_size)]]
        new = self.blocks_for(r, tokens) - len(hits)
        if new + sum(self.refs[b] == 0 for b in hits) > self.free:
            return False
        for b in hits:
            if self.refs[b] == 0:
                del self.evictable[b]
                self.free -= 1
            self.refs[b] += 1
        table = self.tables[r] = hits + [self._allocate() for _ in range(max(new, 0))]
        self.held[r] = len(table)
        if hits:
            self._loads.append((r, keys[:len(hits)]))
        return True

    def _allocate(self) -> int:
        """A free block for new content: an empty one, else the least recently used cached one."""
        if self.empty:
            b = self.empty.pop()
        else:
            b, _ = self.evictable.popitem(last=False)
            key = self.key_of[b]
            del self.cached[key]
            self.key_of[b] = None
            self._evicted.append(key)
        self.refs[b] = 1
        self.free -= 1
        return b

    def shrink_to(self, r: Request, tokens: int) -> None:
        table = self.tables[r]
        keep = self.blocks_for(r, tokens)
        while len(table) > keep:
            self._unref(table.pop())
        self.held[r] = len(table)

    def release(self, r: Request) -> None:
        """Drop r's references, last block first: a prefix's tail is then evicted before its head."""
        for b in reversed(self.tables.pop(r, [])):
            self._unref(b)
        self.held.pop(r, None)
        self._keys.pop(r, None)

    def _unref(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free += 1
            if self.key_of[b] is None:
                self.empty.append(b)
            else:
                self.evictable[b] = None       # most recently used end

    # -- what the backend must do, and what the step made cacheable ------------------------------
    def cache_ops(self, chunks: list[tuple[Request, int]]) -> CacheOps:
        """This step's loads (admissions with a hit) and drops (keys evicted while booking), and
        the full prompt blocks it completes that will enter the cache after it (`commit`)."""
        store, seen = [], set()
        bs = self.block_size
        for r, n in chunks:
            keys = self.keys(r)
            c = r.num_computed_tokens
            for i in range(c // bs, min((c + n) // bs, len(keys))):
                if keys[i] not in self.cached and keys[i] not in seen:
                    seen.add(keys[i])
                    store.append((r, i, keys[i]))
        ops = CacheOps(bs, self._loads, store, self._evicted)
        self._loads, self._evicted = [], []
        return ops

    def commit(self, step: Step) -> None:
        """Key the blocks the step computed (a duplicate of a key cached meanwhile stays unkeyed)."""
        for r, i, key in step.cache.store:
            table = self.tables.get(r)
            if table is not None and key not in self.cached:
                self.cached[key] = table[i]
                self.key_of[table[i]] = key
