"""KV-cache blocks as a continuous scheduler books them (vLLM's block manager, counts only).

A request holds ceil(tokens / block_size) blocks for the tokens it has computed; under `reserve`
it books prompt + max_new_tokens at admission instead, so it can never run out mid-decode.
The pool only counts: which blocks hold what is the backend's business.
"""
from __future__ import annotations

from batchlab.core.request import Request


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative integers, without floats."""
    return -(-a // b)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, reserve: bool = False):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserve = reserve
        self.free = num_blocks
        self.held: dict[Request, int] = {}       # blocks held by each running request

    @property
    def spare(self) -> int:
        """Free blocks a booking can take without evicting anything: here, every free block."""
        return self.free

    def blocks_for(self, r: Request, tokens: int) -> int:
        """Blocks `r` must hold once `tokens` of it are computed."""
        if self.reserve:
            tokens = r.prompt_len + r.max_new_tokens
        return -(-tokens // self.block_size)   # cdiv, inlined: called for every admission attempt

    def can_ever_fit(self, r: Request) -> bool:
        """Could `r` finish alone in an empty cache?"""
        return -(-(r.prompt_len + r.max_new_tokens) // self.block_size) <= self.num_blocks

    def grow(self, r: Request, tokens: int) -> bool:
        """Book what `r` needs for `tokens` computed tokens; False (and nothing booked) if the
        free blocks do not cover it."""
        extra = self.blocks_for(r, tokens) - self.held.get(r, 0)
        if extra > self.free:
            return False
        if extra > 0:
            self.free -= extra
            self.held[r] = self.held.get(r, 0) + extra
        return True

    def shrink_to(self, r: Request, tokens: int) -> None:
        """Give back blocks booked beyond what `tokens` computed tokens need."""
        surplus = self.held[r] - self.blocks_for(r, tokens)
        if surplus > 0:
            self.held[r] -= surplus
            self.free += surplus

    def release(self, r: Request) -> None:
        self.free += self.held.pop(r, 0)

    def cached_tokens(self, r: Request, remember: bool = True) -> int:
        """Prompt tokens an admission would reuse: none without a prefix cache (prefix_cache.py)."""
        return 0
