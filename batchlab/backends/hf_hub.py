"""Where a model name points, decided in seconds: the tiny alias, `random:<shape>` (a bundled
shape, backends/random_model.py; never looked up on the hub), a model directory, or a hub name.

A hub name must be in the local Hugging Face cache unless the hub answers within HUB_PROBE_S.
NOTE: for an uncached hub name we refuse rather than let transformers retry for ~50 s when the
hub is unreachable: the probe is one HTTP request with a deadline, and a user without a network
gets the fix (download elsewhere, or pass a path) at once. No torch here: preflight stays light.
"""
from __future__ import annotations

import os
import re
import threading
from functools import lru_cache
from pathlib import Path

from batchlab.backends import random_model
from batchlab.backends.model_shape import hub_cache_dir
from batchlab.backends.tiny import TINY_ALIAS
from batchlab.errors import ConfigError

HUB_PROBE_S = 3.0                   # seconds the model hub has to answer before we call it unreachable


def check_model(name: str | None) -> list[str]:
    """`name` must be the tiny alias, a bundled `random:<shape>`, a directory holding a model (config.json), or a hub name
    that is cached locally or downloadable now. Decided in seconds: the hub gets HUB_PROBE_S.

    NOTE: for an uncached hub name we refuse rather than let transformers retry for ~50 s
    when the hub is unreachable: the probe is one HTTP request with a deadline, and a user
    without a network gets the fix (download elsewhere, or pass a path) at once."""
    if name in (None, "", TINY_ALIAS):
        return []
    if random_model.is_random(name):
        return random_model.check_name(name)
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
