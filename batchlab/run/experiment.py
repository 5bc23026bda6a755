"""What a results directory holds: one experiment, and its identity.

An experiment is the whole config except what may grow inside it (GROWS: rates, repeats,
strategies) and what does not change a result (NO_EFFECT), plus a digest of every input file it
reads. Two configs with the same identity may share a directory; `differences` names the keys
that keep two others apart, and config.yaml (`recorded_config`) tells what the directory holds.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from batchlab.core.config import RunConfig
from batchlab.run.schema import INPUT_FILES, Key, canonical, resolved_paths, strategy_rank

GROWS = ("strategies", "traffic.rates", "traffic.repeats")       # may grow inside one experiment
NO_EFFECT = ("name", "out", "report", "backend.api_key_env")    # do not change what a point means
def experiment(cfg: RunConfig) -> dict[str, Any]:
    """What a point of this config means: the config less GROWS and NO_EFFECT, plus the content
    digest of each input file it reads (an edited trace is another experiment)."""
    tree = resolved_paths(cfg.tree())
    for dotted in GROWS + NO_EFFECT:
        *parents, leaf = dotted.split(".")
        node = _get(tree, ".".join(parents)) if parents else tree
        if isinstance(node, dict):
            node.pop(leaf, None)
    inputs = {k: _file_digest(v) for k in INPUT_FILES if (v := _get(tree, k))}
    return json.loads(json.dumps(tree | {"input_files": inputs}))


def experiment_digest(exp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(exp, sort_keys=True).encode()).hexdigest()[:12]


def differences(there: dict[str, Any], now: dict[str, Any], limit: int = 4) -> str:
    """`dynamic.max_wait_ms: 50.0 there, 20.0 now; ...`, the keys two experiments differ in."""
    a, b = dict(_flat(there)), dict(_flat(now))
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]
    shown = [f"{k}: {_show(a.get(k, _ABSENT))} there, {_show(b.get(k, _ABSENT))} now" for k in keys[:limit]]
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(shown) + more


_ABSENT = object()


def _show(v: Any) -> str:
    return "absent" if v is _ABSENT else v if isinstance(v, str) else json.dumps(v)


def _flat(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _get(tree: dict, dotted: str) -> Any:
    for k in dotted.split("."):
        tree = tree.get(k) if isinstance(tree, dict) else None
    return tree


def _file_digest(path: str) -> str:
    try:
        return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "unreadable"          # the stage that reads the file says why, in one line


def recorded_config(tree: dict[str, Any], keys: Iterable[Key], digest: str, where: Path) -> str:
    """config.yaml: the config `tree` with strategies, rates and repeats set to those of the points
    recorded, so the file tells what the directory holds, not what the last command asked for; `out`
    is the directory itself and input paths are absolute: `batchlab run config.yaml` reruns it."""
    keys = sorted(keys, key=canonical)
    tree = resolved_paths(json.loads(json.dumps(tree))) | {"out": str(Path(where).resolve())}   # the real directory
    tree.get("backend", {}).pop("api_key", None)      # NOTE: a secret is never written to disk
    strategies = sorted({k[0] for k in keys}, key=strategy_rank)
    rates = sorted({k[1] for k in keys})
    repeats = max(k[2] for k in keys) + 1
    tree["strategies"] = strategies
    tree.setdefault("traffic", {}).update(rates=rates, repeats=repeats)
    have = set(keys)
    missing = [(s, r, p) for r in rates for p in range(repeats) for s in strategies if (s, r, p) not in have]
    head = [f"# Experiment {digest} (identity in experiment.json). strategies, traffic.rates and",
            "# traffic.repeats are those of the points recorded in summary.csv."]
    if missing:
        listed = ", ".join(f"{s} @ {r:g} req/s repeat {p}" for s, r, p in missing[:6])
        head.append(f"# Not recorded: {listed}" + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    return "\n".join(head) + "\n" + yaml.dump(tree, Dumper=_DUMPER, sort_keys=False)


_DUMPER = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper   # libyaml: 10x faster, same YAML
