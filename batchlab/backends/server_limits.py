"""A baseline server's scheduler limits: from a run config's `continuous` section or the command
line, to the server's own flags, and back from what the running server says it runs with.

The limits are named as the `continuous` section names them, so one config drives `batchlab
serve`, a baseline server and the twin alike. A limit left unset is the server's own default, never
batchlab's: a config that says nothing about, say, the token budget starts vLLM with vLLM's.

| continuous key           | vLLM flag                                     | transformers serve flag |
|--------------------------|-----------------------------------------------|-------------------------|
| max_num_seqs             | --max-num-seqs                                | (none)                  |
| max_num_batched_tokens   | --max-num-batched-tokens                      | --cb-max-batch-tokens   |
| chunk_size               | --enable-chunked-prefill, --long-prefill-token-threshold (unset: --no-enable-chunked-prefill) | (none) |
| prefix_caching           | --[no-]enable-prefix-caching                  | (none)                  |
| block_size               | --block-size                                  | --cb-block-size         |
| num_kv_blocks            | --num-gpu-blocks-override                     | --cb-num-blocks         |
| (kv_cache_gib, flag only) | --kv-cache-memory-bytes                      | (none)                  |

NOTE: vLLM's --long-prefill-token-threshold caps one request's prefill tokens per step as
chunk_size does, except that vLLM lifts the cap for a request alone in its step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from batchlab.errors import ConfigError

GIB = 1 << 30


@dataclass(frozen=True)
class ServerLimits:
    """What to start a server with; None leaves the server's own default."""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    chunk_size: int | None = None          # per-request prefill tokens per step (with chunked_prefill)
    prefix_caching: bool | None = None
    block_size: int | None = None
    num_kv_blocks: int | None = None
    kv_cache_gib: float | None = None

    def __post_init__(self) -> None:
        if self.chunked_prefill is False and self.chunk_size is not None:
            raise ConfigError(f"a chunk size ({self.chunk_size}) needs chunked prefill, which is off")

    def given(self) -> dict[str, Any]:
        """The limits set, by name (the state record's "asked")."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def merged(self, over: ServerLimits) -> ServerLimits:
        """These limits with every limit `over` sets replacing ours (command line over config)."""
        return ServerLimits(**(asdict(self) | over.given()))

    def vllm_args(self) -> list[str]:
        args = []
        for key, flag in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens"),
                          ("block_size", "--block-size"), ("num_kv_blocks", "--num-gpu-blocks-override")):
            if getattr(self, key) is not None:
                args += [flag, str(getattr(self, key))]
        for key, flag in (("chunked_prefill", "enable-chunked-prefill"), ("prefix_caching", "enable-prefix-caching")):
            if getattr(self, key) is not None:
                args.append(f"--{flag}" if getattr(self, key) else f"--no-{flag}")
        if self.chunk_size is not None:
            args += ["--long-prefill-token-threshold", str(self.chunk_size)]
        if self.kv_cache_gib is not None:
            args += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gib * GIB))]
        return args

    def transformers_args(self) -> list[str]:
        """`transformers serve --continuous-batching` flags; a limit it has no flag for is refused."""
        unsupported = [k for k in self.given() if k not in ("max_num_batched_tokens", "block_size", "num_kv_blocks")]
        if unsupported:
            raise ConfigError(f"transformers serve has no flag for {', '.join(unsupported)}; "
                              "it takes max_num_batched_tokens, block_size and num_kv_blocks")
        args = []
        for key, flag in (("max_num_batched_tokens", "--cb-max-batch-tokens"), ("block_size", "--cb-block-size"),
                          ("num_kv_blocks", "--cb-num-blocks")):
            if getattr(self, key) is not None:
                args += [flag, str(getattr(self, key))]
        return args


def from_section(section: Any) -> tuple[ServerLimits, list[str]]:
    """The limits a `continuous` section sets explicitly (its defaults are batchlab's, not the
    server's, so they are left out), and warnings for what no server flag expresses."""
    chosen = {k: getattr(section, k) for k in section.model_fields_set}
    warnings = []
    if chosen.pop("preemption", "recompute") != "recompute":
        warnings.append("continuous.preemption 'reserve' is batchlab's own; vLLM preempts by recompute")
    known = {f.name for f in fields(ServerLimits)}
    warnings += [f"continuous.{k} has no server flag; ignored" for k in chosen if k not in known]
    out = {k: v for k, v in chosen.items() if k in known}
    if "chunk_size" in out:
        out["chunked_prefill"] = out["chunk_size"] is not None
    return ServerLimits(**out), warnings
