"""The building blocks of every config section: a strict, frozen model, what a field means to an
experiment's identity, and mistakes as one line.

pydantic does the checking (unknown keys, wrong types, bounds), so every mistake becomes one line
naming the key, e.g. `traffic.rates.0: must be > 0 (got -5)`. A field's docstring is its
description: the config reference is generated from it. A field says what it is to an experiment
with `identity_role(...)`: an input file (hashed by content), a setting that may grow inside one experiment
(more rates, more strategies), or one that does not change what a point means (a name, a path).
"""
from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# Config keys whose values are never echoed in an error line (they may hold a secret).
SECRET_KEYS = ("api_key", "api_key_env", "base_url")

# What a field is to an experiment's identity (run/experiment.py walks the model for these).
ROLE = "identity"
INPUT_FILE = "input file"      # its content is hashed: an edited file is another experiment
GROWS = "grows"                # may grow inside one experiment: another rate, repeat or strategy
NO_EFFECT = "no effect"        # changes no result: where output goes, a display name, an env var's name
IGNORED = "ignored"            # how to run, not what runs: where points run, how to validate


def identity_role(kind: str, default: Any = None, **kwargs) -> Any:
    """A field with an identity role, e.g. `path: str | None = identity_role(INPUT_FILE)`."""
    if "default_factory" in kwargs:
        return Field(json_schema_extra={ROLE: kind}, **kwargs)
    return Field(default, json_schema_extra={ROLE: kind}, **kwargs)


def field_role(model: type[BaseModel], name: str) -> str | None:
    extra = model.model_fields[name].json_schema_extra
    return extra.get(ROLE) if isinstance(extra, dict) else None


class Model(BaseModel):
    """Every config section: unknown keys refused, frozen once checked, numbers finite and never
    booleans."""
    # NOTE: allow_inf_nan=False: an inf or NaN anywhere would turn into an endless arrival loop or
    # a NaN step time; pydantic refuses them with "Input should be a finite number".
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False,
                              use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        # NOTE: YAML's true/false are ints to pydantic's lax mode: `rates: [true]` would run at 1 req/s
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if field is not None and _bool_in_numbers(field.annotation, value):
                    raise ValueError(f"{name}: expected a number, not true or false")
        return data


def _bool_in_numbers(annotation: Any, value: Any) -> bool:
    """A boolean given where the annotation takes numbers (and no booleans), at any list depth."""
    if isinstance(value, list):
        inner = [a for a in _members(annotation) if typing.get_origin(a) is list]
        return any(_bool_in_numbers(typing.get_args(a)[0], v) for a in inner for v in value)
    if not isinstance(value, bool):
        return False
    kinds = _members(annotation)
    return bool not in kinds and any(k in (int, float) for k in kinds)


def _members(annotation: Any) -> list[Any]:
    """The types an annotation admits, with Annotated and Optional unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def format_error(err: ValidationError, tags: dict[str, Any] | None = None) -> str:
    """A pydantic error as one line per problem, joined with '; ', naming each key. `tags`: for
    a union discriminated on a key (`backend` -> its kinds), the tag pydantic puts in the location
    (`backend.sim.preset`) is left out (`backend.preset`)."""
    lines = []
    for e in err.errors():
        parts = [p for p in e["loc"] if not str(p).startswith(("function-", "tagged-"))]
        if tags and len(parts) > 1 and parts[1] in tags.get(parts[0], ()):
            del parts[1]
        msg = e["msg"].removeprefix("Value error, ")
        sub = re.match(r"([A-Za-z_][\w]*(\.[\w]+)*): ", msg)
        if sub and e["type"] == "value_error":      # a section's check naming one of its keys: `rates.1: ...`
            parts, msg = [*parts, sub.group(1)], msg[sub.end():]
        loc = ".".join(_printable(p) for p in parts)
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        got = e.get("input")
        quiet = (e["type"] in ("extra_forbidden", "missing") or isinstance(got, dict)
                 or any(str(p) in SECRET_KEYS for p in e["loc"]))
        tail = "" if quiet else f" (got {short(got)})"
        lines.append(f"{loc or 'config'}: {msg}{tail}")
    return one_line("; ".join(lines))


def _printable(part: Any) -> str:
    s = str(part)
    return s if s.isprintable() and len(s) <= 60 else short(s)


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_line(text: str) -> str:
    """Collapse line breaks (YAML and library messages have them): an error is one line."""
    return " ".join(text.split()) if ("\n" in text or "\r" in text) else text
