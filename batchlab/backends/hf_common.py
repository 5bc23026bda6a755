"""What every Hugging Face engine here shares: loading, devices, memory arithmetic, prompt ids.

Used by the request-level backend (backends/hf.py) and the step-level engine (backends/hf_engine.py).
Memory has three numbers, kept apart on purpose:
  - KV bytes per token, from the model config: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes;
  - the KV budget: a configured `memory_budget_bytes`, else on GPU free memory plus PyTorch's
    cached-but-free blocks minus a reserve for activations, else `DEFAULT_CPU_BUDGET_BYTES`;
  - peak memory of a run (`PeakMemory`), whose `peak_mem_kind` says what was measured.
`preflight` checks `backend.model` before anything is written: a local directory must hold a
model; a hub name must be in the local cache unless the hub answers within HUB_PROBE_S.
"""
from __future__ import annotations

import os
import re
import resource
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchlab.backends.base import Backend
from batchlab.backends.tiny import TINY_ALIAS, resolve_model
from batchlab.core.config import one_line
from batchlab.errors import ConfigError

# NOTE: a CPU has no "free device memory" worth trusting (the OS swaps, other processes grow),
# so without a configured budget we assume 1 GiB of KV: about 262k tokens of the tiny model,
# about 8k tokens of a 7B model in fp32. Set backend.memory_budget_bytes to change it.
DEFAULT_CPU_BUDGET_BYTES = 1 << 30
MIN_RESERVE_BYTES = 256 << 20       # GPU: never plan to fill the device to the last 256 MiB
HUB_PROBE_S = 3.0                   # seconds the model hub has to answer before we call it unreachable


@dataclass(frozen=True)
class Loaded:
    model: Any                        # a transformers PreTrainedModel in eval mode, on `device`
    tokenizer: Any                    # left-padding, pad token set
    device: torch.device
    dtype: torch.dtype
    name: str                         # what the config asked for (hub name, path or `tiny`)

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
    """Load `backend_cfg.model` (hub name, local path, or `tiny`) through from_pretrained.
    NOTE: a hub name is loaded with local_files_only when the hub cannot be reached, so a cached
    model loads at once instead of after transformers' network retries."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    device = pick_device(backend_cfg.device)
    dtype = pick_dtype(backend_cfg.dtype, device)
    threads = getattr(backend_cfg, "threads", None)
    if threads and device.type == "cpu":
        # NOTE: process-wide. On a busy machine fewer threads than cores avoids OpenMP threads
        # spinning while their partner is descheduled (measured: 3 vs 111 tok/s at batch 1).
        torch.set_num_threads(threads)
    path = resolve_model(backend_cfg.model)
    hub = {} if Path(path).is_dir() else {"cache_dir": hub_cache_dir()}    # the cache preflight looked in
    if hub and not hub_reachable():
        hub["local_files_only"] = True
    tokenizer = AutoTokenizer.from_pretrained(path, **hub)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:        # e.g. Llama/Mistral ship no pad token
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    kwargs = {"dtype": dtype, **hub}
    if device.type != "cpu":
        kwargs["device_map"] = str(device)    # load straight onto the GPU, not via host RAM
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device).eval()
    return Loaded(model, tokenizer, device, dtype, backend_cfg.model or "tiny")


def preflight(cfg) -> list[str]:
    """Before anything is written (both HF kinds): the device and `backend.model`. Raises
    ConfigError with one line; returns warning lines."""
    try:
        pick_device(cfg.backend.device)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return check_model(cfg.backend.model)


def check_model(name: str | None) -> list[str]:
    """`name` must be the tiny alias, a directory holding a model (config.json), or a hub name
    that is cached locally or downloadable now. Decided in seconds: the hub gets HUB_PROBE_S.

    NOTE: for an uncached hub name we refuse rather than let transformers retry for ~50 s
    when the hub is unreachable: the probe is one HTTP request with a deadline, and a user
    without a network gets the fix (download elsewhere, or pass a path) at once."""
    if name in (None, "", TINY_ALIAS):
        return []
    p = Path(name).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"backend.model {name!r} is a file; expected a model directory (with config.json) or a hub name")
        if not (p / "config.json").is_file():
            raise ConfigError(f"backend.model {name!r} is not a model directory (no config.json in it)")
        return []
    if not is_repo_id(name):
        raise ConfigError(f"backend.model: no such directory: {name}")
    if in_hub_cache(name):
        return [] if hub_reachable() else [f"backend.model {name!r}: the hub is unreachable; loading the cached copy"]
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ConfigError(f"backend.model {name!r} is not a local directory nor in the Hugging Face cache "
                          f"({hub_cache_dir()}), and HF_HUB_OFFLINE is set")
    if not hub_reachable():
        raise ConfigError(f"backend.model {name!r} is not a local directory nor in the Hugging Face cache "
                          f"({hub_cache_dir()}), and {hub_endpoint()} cannot be reached: download it where there "
                          f"is a network (hf download {name}) and copy the cache, or pass a local path")
    return []


def is_repo_id(name: str) -> bool:
    """'name' or 'org/name' as the hub spells them (letters, digits, - _ .), not a path."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?", name)) and ".." not in name


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def hub_cache_dir() -> str:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def in_hub_cache(repo_id: str) -> bool:
    """True if the local cache holds the repo's config.json (its main revision)."""
    from huggingface_hub import try_to_load_from_cache
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    return isinstance(found, str)


def hub_reachable() -> bool:
    return _probe(hub_endpoint(), HUB_PROBE_S)


@lru_cache(maxsize=8)
def _probe(endpoint: str, timeout_s: float) -> bool:
    """Does the endpoint answer an HTTP request (any status) within `timeout_s`?
    NOTE: urllib honours HTTPS_PROXY like huggingface_hub does; it runs in a daemon thread
    because name resolution has no timeout of its own."""
    import urllib.error
    import urllib.request
    ok = threading.Event()

    def ask():
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
            ok.set()
        except urllib.error.HTTPError:        # it answered, if only to refuse
            ok.set()
        except (OSError, ValueError):
            pass
    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return ok.is_set()


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
    ordinary = np.setdiff1d(np.arange(vocab), tokenizer.all_special_ids)
    idx = request.index            # warm-up requests use negative indexes
    rng = np.random.default_rng([seed, 0, idx] if idx >= 0 else [seed, 1, -idx])
    return ordinary[rng.integers(0, len(ordinary), size=n)].tolist()


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


class ModelBackend(Backend):
    """What both HF backends (`hf`, `hf-cb`) share: a model loaded once through
    `from_pretrained`, its peak-memory window, and tokenizing each request at submission."""

    cfg: Any                               # BackendConfig
    loaded: Loaded | None = None           # may be handed in (tests, benchmarks)
    peak: PeakMemory | None = None

    def _ensure_loaded(self) -> Loaded:
        if self.loaded is None:
            try:
                self.loaded = load(self.cfg)
            except (OSError, ValueError) as e:     # a bad path, not a model, an absent device
                raise ConfigError(f"cannot load backend.model {self.cfg.model or TINY_ALIAS!r}: "
                                  f"{one_line(str(e))[:300]}") from None
        if self.peak is None:
            self.peak = PeakMemory(self.loaded.device)
        return self.loaded

    def reset_peak_memory(self) -> None:
        self._ensure_loaded()
        self.peak.reset()

    def peak_memory(self) -> dict[str, Any]:
        return self.peak.read() if self.peak is not None else {}

    def prepare(self, request) -> None:
        """Tokenize once, at submission. A prompt must be non-empty and fit the context."""
        tokenize_checked(request, self._ensure_loaded())

    def tokenizer(self) -> Any:
        return self._ensure_loaded().tokenizer

    def max_context(self) -> int:
        return context_length(self._ensure_loaded().model)

    def vocab_size(self) -> int:
        return len(self._ensure_loaded().tokenizer)
