"""Backend registry: `backend.kind` -> the factory that builds it from a RunConfig.

Factories are imported lazily, so the simulator path never imports torch or httpx.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

from batchlab.backends.base import Backend
from batchlab.core.config import RunConfig
from batchlab.errors import ConfigError

# backend.kind -> "module:factory"
BACKENDS: dict[str, str] = {
    "sim": "batchlab.backends.simulated:from_config",
    "hf": "batchlab.backends.hf:from_config",
    "hf-cb": "batchlab.backends.hf_cb:from_config",
    "openai": "batchlab.backends.openai:from_config",
}


def make_backend(cfg: RunConfig) -> Backend:
    module, name = BACKENDS[cfg.backend.kind].split(":")
    try:
        factory: Callable[[RunConfig], Backend] = getattr(importlib.import_module(module), name)
    except ImportError as e:
        extra = "serve" if cfg.backend.kind == "openai" else "hf"
        raise ConfigError(f"backend.kind '{cfg.backend.kind}' needs the '{extra}' extra "
                          f"(pip install 'batchlab[{extra}]'): {e}") from None
    return factory(cfg)
