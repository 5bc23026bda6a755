"""Which keys a run reads: a key the user set that the chosen backend or arrival process ignores
gets a warning line (`backend.model` with the simulator, `continuous.*` against a server, ...).
"""
from __future__ import annotations

from pydantic import BaseModel

from batchlab.core.config import POLICIES, RunConfig, TrafficConfig

# backend.* keys each kind reads (`kind` itself applies to all).
_HF_KEYS = {"model", "dtype", "device", "threads", "memory_budget_bytes", "warmup_batches"}
BACKEND_KEYS: dict[str, set[str]] = {
    "sim": {"preset", "profile", "replicas", "router"},
    "hf": _HF_KEYS,
    "hf-cb": _HF_KEYS,
    "openai": {"model", "base_url", "api_key_env", "timeout_s", "prompt_format", "length_control", "max_connections"},
}
# Strategy sections (or single knobs) a kind never reads.
IGNORED_SECTIONS: dict[str, tuple[str, ...]] = {
    "sim": (), "hf": (),
    "hf-cb": ("naive", "dynamic", "continuous.chunk_size", "continuous.preemption", "continuous.prefix_caching",
              "priority", "sjf", "vtc"),
    "openai": ("naive", "dynamic", "continuous", "priority", "sjf", "vtc"),
}


def config_warnings(cfg: RunConfig) -> list[str]:
    """One line per key the user set that this run will not read (print as `warning: ...`)."""
    given = cfg._given if cfg._given is not None else _set_keys(cfg)
    kind = cfg.backend.kind
    out = []
    for key in sorted(given):
        section, _, rest = key.partition(".")
        name = rest.split(".")[0]
        if section == "backend" and name and name != "kind" and name not in BACKEND_KEYS[kind]:
            out.append(f"backend.{name} does not apply to backend.kind '{kind}' (ignored)")
        elif any(key == s or key.startswith(s + ".") for s in IGNORED_SECTIONS[kind]):
            out.append(f"{key} does not apply to backend.kind '{kind}' (ignored)")
        elif section in POLICIES and section not in cfg.strategies:
            out.append(f"{section}.{name} does not apply: '{section}' is not among the strategies (ignored)")
        elif section == "traffic":
            reason = _traffic_ignores(cfg.traffic, name)
            if reason:
                out.append(f"traffic.{name} does not apply {reason} (ignored)")
    return list(dict.fromkeys(out))


def _traffic_ignores(t: TrafficConfig, name: str) -> str | None:
    if t.arrival == "trace" and name in ("rates", "prompt_len", "output_len", "rate_step", "burstiness", "seed"):
        return "to arrival 'trace' (the file sets arrivals and lengths)"
    if name == "burstiness" and t.arrival != "gamma":
        return f"to arrival '{t.arrival}' (only gamma has a shape)"
    if name in ("trace_file", "replay") and t.arrival != "trace":
        return f"to arrival '{t.arrival}' (set traffic.arrival=trace to replay it)"
    return None


def _set_keys(model: BaseModel, prefix: str = "") -> set[str]:
    keys = set()
    for name in model.model_fields_set:
        value = getattr(model, name)
        keys |= _set_keys(value, f"{prefix}{name}.") if isinstance(value, BaseModel) else {prefix + name}
    return keys
