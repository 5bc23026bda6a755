"""The `hf-cb` backend kind: transformers' own continuous batching, a load target in-process.

The library's manager batches for itself (its own FIFO scheduler and paged KV cache), so its runs
are recorded under the strategy `server`; it runs under the continuous section's budgets (sequence
cap, token budget, KV blocks), and no other scheduler section applies. The manager is built in
backends/hf_cb_backend.py, imported only when the backend is built.
"""
from __future__ import annotations

from typing import Literal

from batchlab.backends.base import TARGET
from batchlab.backends.hf import ModelOptions


class HFCBOptions(ModelOptions):
    """transformers' continuous batching (`generate_batch`'s manager) on a Hugging Face model."""
    kind: Literal["hf-cb"] = "hf-cb"
    """transformers' own continuous batching."""
    role = TARGET
    reads = {"continuous": ("max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "block_size")}

    def build(self, cfg):
        from batchlab.backends.hf_cb_backend import HFCBBackend
        return HFCBBackend(self, cfg.continuous)
