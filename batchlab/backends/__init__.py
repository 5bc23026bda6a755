"""Backend registry: `backend.kind` -> the factory that builds it from a RunConfig, and the
preflight that checks what it will read before anything is written.

Factories and preflights are imported lazily, so the simulator path never imports torch or httpx.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import fields

from batchlab.backends.base import Backend
from batchlab.core.applies import config_warnings
from batchlab.core.config import RunConfig
from batchlab.core.traffic import check_inputs
from batchlab.errors import ConfigError

# backend.kind -> "module:factory"
BACKENDS: dict[str, str] = {
    "sim": "batchlab.backends.simulated:from_config",
    "hf": "batchlab.backends.hf:from_config",
    "hf-cb": "batchlab.backends.hf_cb:from_config",
    "openai": "batchlab.backends.openai:from_config",
}

# backend.kind -> "module:function(cfg) -> list[str]" that checks a real backend's inputs
# (model path or hub cache, the server and its model list); the simulator's is `_check_cost`.
PREFLIGHTS: dict[str, str] = {
    "hf": "batchlab.backends.hf_common:preflight",
    "hf-cb": "batchlab.backends.hf_common:preflight",
    "openai": "batchlab.backends.openai:preflight",
}


def make_backend(cfg: RunConfig) -> Backend:
    factory: Callable[[RunConfig], Backend] = _load(cfg.backend.kind, BACKENDS[cfg.backend.kind])
    return factory(cfg)


def preflight(cfg: RunConfig) -> list[str]:
    """Check everything a run will read, before its first file is written: the preset or
    profile, the trace or ShareGPT files (row by row, and the per-point caps with real lengths),
    the model path or hub cache, the server and its model list. Raises ConfigError (one line)
    on the first problem; returns warning lines (keys the backend ignores, unchecked facts)."""
    warnings = config_warnings(cfg)
    warnings += check_inputs(cfg.traffic)
    if cfg.backend.kind == "sim":
        _check_cost(cfg)
    else:
        warnings += _load(cfg.backend.kind, PREFLIGHTS[cfg.backend.kind])(cfg)
    return warnings


def _check_cost(cfg: RunConfig) -> None:
    """The simulator's step-time model: a known preset, or a profile whose numbers are usable."""
    from batchlab.backends.presets import load_cost
    cost = load_cost(cfg.backend.preset, cfg.backend.profile)
    for f in fields(cost):
        v = getattr(cost, f.name)
        if f.type in ("float", "int") and not (isinstance(v, int | float) and not isinstance(v, bool)
                                               and math.isfinite(v) and v >= 0):
            raise ConfigError(f"{cfg.backend.profile}: {f.name} must be a finite number >= 0 (got {v!r})")
    if cost.kv_bytes_per_token <= 0:
        raise ConfigError(f"{cfg.backend.profile}: kv_bytes_per_token must be > 0 (got {cost.kv_bytes_per_token!r})")


def _load(kind: str, target: str):
    module, name = target.split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        extra = "serve" if kind == "openai" else "hf"
        raise ConfigError(f"backend.kind '{kind}' needs the '{extra}' extra "
                          f"(pip install 'batchlab[{extra}]'): {e}") from None
