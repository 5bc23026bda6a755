"""What every Hugging Face engine here shares: loading, devices, memory arithmetic, prompt ids.

Used by the request-level backend (backends/hf.py) and the step-level engine (backends/hf_engine.py).
Memory has three numbers, kept apart on purpose:
  - KV bytes per token, from the model config: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes;
  - the KV budget: a configured `memory_budget_bytes`, else on GPU free memory plus PyTorch's
    cached-but-free blocks minus a reserve for activations, else `DEFAULT_CPU_BUDGET_BYTES`;
  - peak memory of a run (`PeakMemory`), whose `peak_mem_kind` says what was measured.
`preflight` checks the device and `backend.model` before anything is written (backends/hf_hub.py
says what a model name may be; `random:<shape>` is a real shape with random weights,
backends/random_model.py).
"""
from __future__ import annotations

import functools
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchlab.backends import random_model, torch_thread
from batchlab.backends.hf_hub import check_model, hub_cache_dir, hub_reachable
from batchlab.backends.tiny import TINY_ALIAS, resolve_model
from batchlab.core.config import one_line
from batchlab.errors import ConfigError

# NOTE: a CPU has no "free device memory" worth trusting (the OS swaps, other processes grow),
# so without a configured budget we assume 1 GiB of KV: about 262k tokens of the tiny model,
# about 8k tokens of a 7B model in fp32. Set backend.memory_budget_bytes to change it.
DEFAULT_CPU_BUDGET_BYTES = 1 << 30
MIN_RESERVE_BYTES = 256 << 20       # GPU: never plan to fill the device to the last 256 MiB


@dataclass(frozen=True)
class Loaded:
    model: Any                        # a transformers PreTrainedModel in eval mode, on `device`
    tokenizer: Any                    # left-padding, pad token set
    device: torch.device
    dtype: torch.dtype
    name: str                         # how outputs name it: the config's hub name, path or `tiny`,
                                      # or `random:<shape> (random weights)`

    def __iter__(self):               # `model, tokenizer, device, dtype = load(cfg)`
        return iter((self.model, self.tokenizer, self.device, self.dtype))


def pick_device(name: str = "auto") -> torch.device:
    """`auto`: cuda, then mps, then cpu. An explicit device that is absent is a user error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"backend.device '{name}': no CUDA device here (torch {torch.__version__})")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"backend.device '{name}': MPS is not available here")
    return dev


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: fp16 on GPUs (cuda, mps), fp32 on CPU (CPU half-precision matmuls are slow)."""
    if name == "auto":
        return torch.float16 if device.type in ("cuda", "mps") else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"backend.dtype '{name}': expected auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


def load(backend_cfg) -> Loaded:
    """Load `backend_cfg.model`: a hub name, local path or `tiny` through from_pretrained, or
    `random:<shape>` built on the device (backends/random_model.py).
    NOTE: a hub name is loaded with local_files_only when the hub cannot be reached, so a cached
    model loads at once instead of after transformers' network retries."""
    device = pick_device(backend_cfg.device)
    dtype = pick_dtype(backend_cfg.dtype, device)
    threads = getattr(backend_cfg, "threads", None)
    if threads and device.type == "cpu":
        # NOTE: process-wide. On a busy machine fewer threads than cores avoids OpenMP threads
        # spinning while their partner is descheduled (measured: 3 vs 111 tok/s at batch 1).
        torch.set_num_threads(threads)
    if random_model.is_random(backend_cfg.model):
        model, tokenizer = random_model.build(backend_cfg.model, device, dtype)
        tokenizer.pad_token = tokenizer.eos_token     # like Llama/Mistral: no pad token of its own
        return Loaded(model, tokenizer, device, dtype, random_model.label(backend_cfg.model))
    return _from_pretrained(backend_cfg.model, device, dtype)


def _from_pretrained(name: str | None, device: torch.device, dtype: torch.dtype) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = resolve_model(name)
    hub = _hub_options(path)
    tokenizer = AutoTokenizer.from_pretrained(path, **hub)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:        # e.g. Llama/Mistral ship no pad token
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    kwargs = {"dtype": dtype, **hub}
    if device.type != "cpu":
        kwargs["device_map"] = str(device)    # load straight onto the GPU, not via host RAM
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device).eval()
    return Loaded(model, tokenizer, device, dtype, name or "tiny")


def preflight(cfg) -> list[str]:
    """Before anything is written (both HF kinds): the device and `backend.model`. Raises
    ConfigError with one line; returns warning lines."""
    try:
        pick_device(cfg.backend.device)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return check_model(cfg.backend.model)


def require_fused(name: str | None) -> None:
    """ConfigError (one line) unless the model's config says the fused pass can run it."""
    from batchlab.backends import hf_fused
    why = hf_fused.supported_config(model_config(name))
    if why is not None:
        raise ConfigError(hf_fused.refusal(why))


def model_config(name: str | None):
    """The model's config alone (no weights), from wherever `load` would take the model."""
    from transformers import AutoConfig
    if random_model.is_random(name):
        return random_model.config_of(name)
    path = resolve_model(name)
    return AutoConfig.from_pretrained(path, **_hub_options(path))


def _hub_options(path: str) -> dict[str, Any]:
    """from_pretrained's keywords for `path`: none for a local directory; for a hub name the cache
    the preflight looked in, and local files only when the hub cannot be reached."""
    if Path(path).is_dir():
        return {}
    hub: dict[str, Any] = {"cache_dir": hub_cache_dir()}
    if not hub_reachable():
        hub["local_files_only"] = True
    return hub


def context_length(model) -> int:
    """Tokens of context the model was built for (prompt + output must fit)."""
    cfg = model.config.get_text_config()
    return int(getattr(cfg, "max_position_embeddings", None) or 2048)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem


def device_memory_budget(device: torch.device, configured: int | None, reserve_bytes: int = 0) -> int:
    """Bytes the KV cache may use: configured if set; on CUDA what is free now (including
    PyTorch's cached-but-free blocks) minus `reserve_bytes` (activations, measured by a test
    batch); otherwise DEFAULT_CPU_BUDGET_BYTES."""
    if configured is not None:
        return int(configured)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached_free = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return max(0, free + cached_free - max(reserve_bytes, MIN_RESERVE_BYTES))
    return DEFAULT_CPU_BUDGET_BYTES


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a clock reading after it means the work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def is_oom(err: BaseException) -> bool:
    """A real out-of-memory error: torch's (CUDA, MPS) or the CPU allocator's."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def free_cached(device: torch.device) -> None:
    """After an out-of-memory error: hand cached blocks back so the retry starts clean."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


class PeakMemory:
    """Peak memory of one measured window; `read()` says which number it is.

    - cuda: `torch.cuda.max_memory_allocated` since `reset()`: tensors PyTorch allocated on the
      GPU (weights + KV cache + activations), not the driver's or the caching allocator's slack;
    - cpu/mps: the process's peak resident set size above its size at `reset()` (Linux: VmHWM,
      reset through /proc/self/clear_refs). Where the peak cannot be reset, the lifetime peak
      (ru_maxrss) is used and the kind says so.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = 0
        self.resettable = True

    def reset(self) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self.baseline = _rss_bytes()
        try:
            Path("/proc/self/clear_refs").write_text("5")   # resets VmHWM to the current RSS
        except OSError:
            self.resettable = False

    def read(self) -> dict[str, Any]:
        if self.device.type == "cuda":
            synchronize(self.device)
            return {"peak_mem_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                    "peak_mem_kind": "cuda_max_memory_allocated"}
        peak = _peak_rss_bytes() if self.resettable else None
        kind = "cpu_peak_rss_above_baseline"
        if peak is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
            kind = "cpu_lifetime_peak_rss_above_baseline"
        return {"peak_mem_bytes": max(0, peak - self.baseline), "peak_mem_kind": kind}


def _rss_bytes() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def _peak_rss_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def prompt_ids(request, tokenizer, vocab: int | None = None, seed: int = 0) -> list[int]:
    """Exactly `request.prompt_len` token ids, the same on every run.

    From the request's text when it has one (truncated, or repeated to length); otherwise
    seeded synthetic ids drawn by the request's trace index from the ordinary vocabulary
    (special tokens excluded, so no stray EOS or BOS inside a prompt).
    """
    n = request.prompt_len
    if request.prompt_token_ids is not None and len(request.prompt_token_ids) == n:
        return list(request.prompt_token_ids)
    vocab = vocab or len(tokenizer)
    if request.prompt:
        ids = tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
        if ids:
            return (ids * (n // len(ids) + 1))[:n]
    ordinary = _ordinary_ids(vocab, tuple(tokenizer.all_special_ids))
    idx = request.index            # warm-up requests use negative indexes
    rng = np.random.default_rng([seed, 0, idx] if idx >= 0 else [seed, 1, -idx])
    return ordinary[rng.integers(0, len(ordinary), size=n)].tolist()


@functools.lru_cache(maxsize=8)
def _ordinary_ids(vocab: int, special: tuple[int, ...]) -> np.ndarray:
    """The ids a synthetic prompt draws from: the vocabulary without its special tokens. Kept per
    tokenizer: set difference sorts the whole vocabulary, and on a real model's (some 128 k ids)
    doing that for every request costs more than the rest of its preparation."""
    ordinary = np.setdiff1d(np.arange(vocab), special)
    ordinary.flags.writeable = False
    return ordinary


def tokenize_checked(request, lm) -> None:
    """Tokenize once, at submission (both HF backends). A prompt must be non-empty, and prompt
    plus output must fit the model's context; otherwise ValueError with the numbers."""
    if request.prompt_len <= 0:
        raise ValueError(f"request {request.request_id}: empty prompt (prompt_len {request.prompt_len})")
    ctx = context_length(lm.model)
    if request.prompt_len + request.max_new_tokens > ctx:
        raise ValueError(f"request {request.request_id}: prompt ({request.prompt_len} tokens) + "
                         f"output ({request.max_new_tokens}) exceed the model context ({ctx} tokens)")
    request.prompt_token_ids = prompt_ids(request, lm.tokenizer, len(lm.tokenizer))


class LoadedModel:
    """What both HF backends (`hf`, `hf-cb`) hold: a model loaded once through `from_pretrained`
    (or handed in by a test or benchmark), its peak-memory window, and tokenizing each request at
    submission. A part of each backend, not a backend itself."""

    def __init__(self, cfg: Any, loaded: Loaded | None = None):
        self.cfg = cfg                         # the kind's options (backends/hf.py)
        self.loaded = loaded
        self.peak: PeakMemory | None = None

    def get(self) -> Loaded:
        """The model, loaded on first use (on the torch thread: loading initialises weights with
        parallel ops); a model that cannot be loaded is one ConfigError line."""
        if self.loaded is None:
            try:
                self.loaded = torch_thread.call(load, self.cfg)
            except (OSError, ValueError) as e:     # a bad path, not a model, an absent device
                raise ConfigError(f"cannot load backend.model {self.cfg.model or TINY_ALIAS!r}: "
                                  f"{one_line(str(e))[:300]}") from None
        if self.peak is None:
            self.peak = PeakMemory(self.loaded.device)
        return self.loaded

    def reset_peak_memory(self) -> None:
        self.get()
        self.peak.reset()

    def peak_memory(self) -> dict[str, Any]:
        return self.peak.read() if self.peak is not None else {}

    def prepare(self, request) -> None:
        """Tokenize once, at submission. A prompt must be non-empty and fit the context."""
        tokenize_checked(request, self.get())

    def unload(self) -> torch.device | None:
        """Forget the model (and its peak window); returns the device it was on, if any."""
        dev = self.loaded.device if self.loaded is not None else None
        self.loaded, self.peak = None, None
        return dev
