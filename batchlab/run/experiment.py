"""What a results directory holds: one experiment, and its identity, computed in one place.

The identity is the config as a tree, less the fields whose role (core/config/base.py) says they
may grow inside one experiment (rates, repeats, strategies), change no result (a name, a path) or
say how to run rather than what (where points run), plus the content digest of every input file,
wherever it sits in the config: both are found by walking the model, never listed. Defaults are
left out, against a schema: schema 1 recorded every key the config had when directories were first
written (batchlab/data/identity/schema1.json, frozen), so those keys always appear, at their value
(or the recorded default, for a key the chosen backend kind no longer has); any later key appears
only when it differs from its default. Adding a key therefore never changes an identity, and a
directory recorded under schema 1 keeps its digest. NOTE: changing the default of a key outside
schema 1 would go unseen: that takes a new schema (tests/run/test_identity.py pins them).
A point's hash and its CSV `knobs` are cut from the same tree.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from batchlab.core.config import GROWS, IGNORED, INPUT_FILE, NO_EFFECT, RunConfig, field_role

SCHEMA = 1
BASELINE: dict[str, Any] = json.loads(resources.files("batchlab").joinpath(f"data/identity/schema{SCHEMA}.json").read_text())
LEFT_OUT = (GROWS, NO_EFFECT, IGNORED)


def identity(cfg: RunConfig) -> dict[str, Any]:
    """What a point of this config means (see the module docstring)."""
    tree = _project(_tree(cfg, LEFT_OUT), _defaults(cfg, LEFT_OUT), BASELINE, fill=True)
    files = input_files(cfg)
    return with_absolute_inputs(tree, files) | {"input_files": {k: _file_digest(v) for k, v in files.items()}}


def digest(identity_tree: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity_tree, sort_keys=True).encode()).hexdigest()[:12]


def point_hash(cfg: RunConfig, strategy: str) -> str:
    """Digest of everything that shapes one strategy's points: the backend, the strategy's own
    sections (its knobs), the traffic and the SLO (not the list of rates or repeats)."""
    tree = identity(cfg)
    shape = {"backend": tree["backend"], "knobs": knobs(cfg, strategy), "traffic": tree["traffic"], "slo": tree["slo"]}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:12]


def knobs(cfg: RunConfig, strategy: str) -> dict[str, Any]:
    """The settings that shape one strategy's runs, flattened (`continuous.max_num_seqs`), for CSV
    rows and reports: the sections its scheduler runs under, a load target's own keys, or a managed
    baseline's version and flags (always, defaults or not: a new vLLM is a new point)."""
    from batchlab.backends import TARGET
    from batchlab.backends.baselines import BASELINES, options
    from batchlab.schedulers import scheduler_class
    b = cfg.backend
    if strategy in BASELINES:                           # a managed baseline: its version and flags
        return options(cfg, strategy).knobs()
    if b.role == TARGET:
        backend = identity(cfg)["backend"]
        out = {f"backend.{k}": backend.get(k) for k in b.knob_keys}
        sections = tuple(b.reads)
    else:
        out, sections = {}, scheduler_class(strategy).sections()
    for name in sections:
        section = getattr(cfg, name)
        tree = _tree(section, LEFT_OUT)
        values = _project(tree, _defaults(section, LEFT_OUT), BASELINE.get(name, tree), fill=False)
        out |= {f"{name}.{k}": v for k, v in values.items()}
    return out


def input_files(model: BaseModel, prefix: str = "") -> dict[str, str]:
    """Every input file the config names, by dotted key (`traffic.classes.0.prompt_len.path`)."""
    found = {}
    for name in type(model).model_fields:
        value, key = getattr(model, name), f"{prefix}{name}"
        if field_role(type(model), name) == INPUT_FILE and value:
            found[key] = str(value)
        for sub, item in _children(value, key):
            found |= input_files(item, sub + ".")
    return found


def with_absolute_inputs(tree: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """`tree` with each input file's path made absolute, as the run resolves it (from the working
    directory). NOTE: so config.yaml names the files that ran wherever it is read from, and the
    same file named relatively or absolutely is one experiment and one point."""
    tree = json.loads(json.dumps(tree))
    for dotted, path in files.items():
        *parents, leaf = dotted.split(".")
        node: Any = tree
        for k in parents:
            node = node[int(k)] if isinstance(node, list) else node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and Path(path).exists():   # not a name (random:<shape>, org/model)
            node[leaf] = str(Path(path).resolve())
    return tree


def config_tree(cfg: RunConfig) -> dict[str, Any]:
    """The config as config.yaml records it: every setting but where points run and how to
    validate, defaults left out as in the identity (the run's name, strategies, rates, repeats
    and output always in), input paths absolute; sections in a reader's order."""
    from batchlab.schedulers import option_sections
    always = {**BASELINE, "name": 0, "strategies": 0, "out": 0, "report": 0,
              "traffic": {**BASELINE["traffic"], "rates": 0, "repeats": 0}}
    tree = _project(_tree(cfg, (IGNORED,)), _defaults(cfg, (IGNORED,)), always, fill=False)
    first = ["name", "backend", "strategies", *option_sections(), "traffic", "slo"]
    tree = {k: tree[k] for k in first if k in tree} | {k: v for k, v in tree.items() if k not in first}
    return with_absolute_inputs(tree, input_files(cfg))


def _children(value: Any, key: str) -> Iterator[tuple[str, BaseModel]]:
    if isinstance(value, BaseModel):
        yield key, value
    elif isinstance(value, list):
        yield from ((f"{key}.{i}", v) for i, v in enumerate(value) if isinstance(v, BaseModel))


def _tree(model: BaseModel, leave_out: tuple[str, ...]) -> dict[str, Any]:
    """The model as JSON-ready data, less the fields whose role is in `leave_out` (at any depth)."""
    out = {}
    for name in type(model).model_fields:
        if field_role(type(model), name) in leave_out:
            continue
        value = getattr(model, name)
        out[name] = _tree(value, leave_out) if isinstance(value, BaseModel) else _json(value)
    return out


def _defaults(value: BaseModel, leave_out: tuple[str, ...], default: BaseModel | None = None) -> dict[str, Any]:
    """The tree of defaults beside `_tree(value)`: the values of the default instance (`type(value)()`
    unless given), section by section; a section holding another class than its default's (a backend
    of another kind) is compared with that class's own defaults; an optional section whose default
    is None differs from any value it is given."""
    default = default if default is not None else type(value)()
    out = {}
    for name in type(value).model_fields:
        if field_role(type(value), name) in leave_out:
            continue
        v, d = getattr(value, name), getattr(default, name)
        if isinstance(v, BaseModel) and isinstance(d, BaseModel) and type(d) is not type(v):
            try:
                d = type(v)()
            except ValidationError:          # no defaults of its own (a length needs its value)
                pass
        out[name] = _defaults(v, leave_out, d) if isinstance(v, BaseModel) and type(d) is type(v) else _json(d)
    return out


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_json(v) for v in value]
    return json.loads(json.dumps(value, default=str)) if not isinstance(value, str | int | float | bool | None) else value


def _project(value: dict, default: dict, baseline: Any, fill: bool) -> dict[str, Any]:
    """Keys of `baseline` always (at their value; with `fill`, at the baseline's value where the
    model has no such key); other keys only where they differ from their default."""
    out = {}
    for k, v in value.items():
        if isinstance(baseline, dict) and k in baseline:
            both = isinstance(v, dict) and isinstance(baseline[k], dict) and isinstance(default.get(k), dict)
            out[k] = _project(v, default[k], baseline[k], fill) if both else v
        elif v != default.get(k):
            out[k] = v
    if fill and isinstance(baseline, dict):
        out |= {k: baseline[k] for k in baseline if k not in value}
    return out


def differences(there: dict[str, Any], now: dict[str, Any], limit: int = 4) -> str:
    """`dynamic.max_wait_ms: 50.0 there, 20.0 now; ...`, the keys two experiments differ in."""
    a, b = dict(flatten(there)), dict(flatten(now))
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]
    shown = [f"{k}: {_show(a.get(k, _ABSENT))} there, {_show(b.get(k, _ABSENT))} now" for k in keys[:limit]]
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(shown) + more


_ABSENT = object()


def _show(v: Any) -> str:
    return "absent" if v is _ABSENT else v if isinstance(v, str) else json.dumps(v)


def flatten(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every leaf of a config tree (an empty section is a leaf)."""
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            yield from flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _file_digest(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"        # a model directory is known by its config (weights are not read to size it)
    try:
        return "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except OSError:
        return "unreadable"          # the stage that reads the file says why, in one line
