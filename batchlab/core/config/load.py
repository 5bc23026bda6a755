"""Reading what a user wrote: a YAML file and `--set KEY=VALUE` overrides, into one nested tree.

Overrides are parsed as YAML scalars, so `--set traffic.rates=[5,10]` and `--set
naive.batch_size=8` work. Every mistake is one ConfigError line; validating the tree is the
config model's business (run/config.py assembles it from the registries).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from batchlab.core.config.base import one_line, short
from batchlab.errors import ConfigError


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: what went wrong and where."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return one_line(f"{problem}{where}")


def set_path(tree: dict, dotted: str, value: Any) -> None:
    """tree[a][b][c] = value for `a.b.c`, making sections on the way."""
    keys = dotted.split(".")
    if any(not k.strip() for k in keys):
        raise ConfigError(f"--set {dotted!r}: empty key name (expected e.g. traffic.rates=[5,10])")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(one_line(f"--set {dotted}: '{k}' is not a section"))
        node = nxt
    node[keys[-1]] = value


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    """`KEY=VALUE` strings as (dotted key, YAML value)."""
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError as e:
            # NOTE: one_line: the key itself may hold a line break (found by tests/core/test_fuzz_inputs.py)
            raise ConfigError(one_line(f"--set {key}: cannot parse {short(raw)}: {yaml_problem(e)}")) from None
        except RecursionError:
            raise ConfigError(f"--set {key}: value nested too deeply") from None
        out.append((key.strip(), value))
    return out


def read_yaml(p: Path) -> dict:
    """A config file's top-level mapping."""
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        loaded = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {yaml_problem(e)}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return loaded


def leaves(tree: Any, prefix: str = "") -> set[str]:
    """The dotted keys of a tree's leaves (`a.b` for {a: {b: 1}})."""
    if not isinstance(tree, dict) or not tree:
        return {prefix.rstrip(".")} if prefix else set()
    out = set()
    for k, v in tree.items():
        out |= leaves(v, f"{prefix}{k}.")
    return out


def user_tree(path: str | Path | None, overrides: list[str], base: dict | None = None) -> tuple[dict, set[str]]:
    """The tree a command line describes (CONFIG, else `base`, then --set) and the keys the user gave."""
    tree: dict = dict(base or {})
    given: set[str] = set()
    if path is not None:
        tree = read_yaml(Path(path))
        given |= leaves(tree)
    for key, value in parse_overrides(list(overrides)):
        set_path(tree, key, value)
        given |= leaves(value, key + ".") if isinstance(value, dict) and value else {key}
    return tree, given
