"""Backend registry: `backend.kind` -> the config model that describes, builds and checks that kind.

Each kind's model (a `BackendOptions` subclass, backends/base.py) lives in a light module of its
own: heavy libraries (torch, httpx) are imported only when a backend is built or checked, so the
simulator path never loads them. Add a kind with one module and one line in KINDS, or from another
package through the `batchlab.backends` entry-point group, or at run time with `register`.
"""
from __future__ import annotations

import functools
import importlib
import sys
from importlib.metadata import entry_points

from batchlab.backends.base import ENGINE, TARGET, Backend, BackendOptions, Engine, EngineFacts, LoadTarget
from batchlab.core.config import RunConfig
from batchlab.errors import ConfigError

__all__ = ["ENGINE", "KINDS", "TARGET", "Backend", "BackendOptions", "Engine", "EngineFacts", "LoadTarget", "kinds",
           "make_backend", "register", "unregister"]

# backend.kind -> "module:OptionsClass"
KINDS: dict[str, str] = {
    "sim": "batchlab.backends.simulated:SimOptions",
    "hf": "batchlab.backends.hf:HFOptions",
    "hf-cb": "batchlab.backends.hf_cb:HFCBOptions",
    "openai": "batchlab.backends.openai:OpenAIOptions",
}
GROUP = "batchlab.backends"
_loaded: dict[str, type[BackendOptions]] = {}


def register(options: type[BackendOptions]) -> type[BackendOptions]:
    """Make `options` (a BackendOptions subclass with `kind: Literal["name"]`) a backend kind."""
    kind = options.model_fields["kind"].default
    if not (isinstance(options, type) and issubclass(options, BackendOptions)) or not isinstance(kind, str):
        raise TypeError(f"{options!r} is not a BackendOptions subclass with a default kind")
    _loaded[kind] = options
    return options


def unregister(kind: str) -> None:
    """Forget a kind registered at run time (a test's)."""
    _loaded.pop(kind, None)


def kinds() -> dict[str, type[BackendOptions]]:
    """Every registered kind's config model, built-in kinds first."""
    for kind, target in KINDS.items():
        if kind not in _loaded:
            module, name = target.split(":")
            register(getattr(importlib.import_module(module), name))
    for ep in _plugins(tuple(sys.path)):
        if ep.name not in _loaded:
            try:
                register(ep.load())
            except Exception as e:      # another package's plugin must not break every command
                raise ConfigError(f"backend kind '{ep.name}' ({ep.value}) could not be loaded: {type(e).__name__}: {e}") from None
    order = list(KINDS) + sorted(k for k in _loaded if k not in KINDS)
    return {k: _loaded[k] for k in order if k in _loaded}


@functools.lru_cache(maxsize=4)
def _plugins(path: tuple[str, ...]) -> tuple:
    """The installed backend kinds' entry points. NOTE: reading every distribution's metadata takes
    about 20 ms, and a report asks for a strategy's colour hundreds of times: read once per sys.path."""
    return tuple(entry_points(group=GROUP))


def make_backend(cfg: RunConfig) -> Backend:
    """The run's backend, built by its kind's config model."""
    try:
        return cfg.backend.build(cfg)
    except ImportError as e:
        raise ConfigError(f"backend.kind '{cfg.backend.kind}' needs the '{cfg.backend.extra}' extra "
                          f"(pip install 'batchlab[{cfg.backend.extra}]'): {e}") from None
