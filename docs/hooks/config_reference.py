"""The config reference, generated from the schema: every field of every section, with its type,
default, bounds and docstring.

The run's config model is assembled from the registries (`batchlab.run.config.config_model()`:
the sections every run has, plus one section per scheduler with options), and `backend` is a union
of every registered kind's model (`batchlab.backends.kinds()`). This walks both, so a new field, a
new scheduler or a new backend kind appears here with no edit to the docs.

Used two ways:
- as an MkDocs hook (mkdocs.yml `hooks:`): the page `reference/config.md` is generated at build
  time, so it cannot go stale;
- as a script: `python docs/hooks/config_reference.py` prints the page (Markdown) to stdout.
"""
from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal, Union

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PAGE = "reference/config.md"

INTRO = """\
# Config reference

Every key a config file or `--set KEY=VALUE` can set, generated from the schema at build time:
each row is a field of the config model, its type, its default (what the key holds when a config
leaves it out), its bounds and its docstring. A config is checked against exactly this: an
unknown key, a wrong type or a value out of bounds is one `error:` line naming the key, and
nothing is written. The packaged default sweep (`make run`, `configs/sim.yaml`) sets some keys to
other values than these defaults.

Set a key in YAML by its path (`traffic:` then `rates: [5, 20]`) or on the command line
(`--set traffic.rates=[5,20]`, `--set backend.linear='{step_ms: 25, per_seq_ms: 0.4}'`). Sections
come from what is registered: each scheduler with options adds the section named after it, and
each backend kind adds the fields `backend:` takes when `kind` is that kind, so a scheduler or a
backend of your own (see [the policy lab](../guides/policies.md) and
[the architecture](../architecture.md)) appears here too.
"""


# ---------------------------------------------------------------------------------------------
# types, bounds, defaults


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """(the bare type, the metadata of every Annotated layer around it)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        tp = args[0]
        for m in args[1:]:
            meta.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    return tp, meta


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """The config models a field's type holds (directly, optionally, or as list items)."""
    tp, _ = _unwrap(tp)
    if _is_model(tp):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models_in(arg)]


def _num(x: Any) -> str:
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return f"{x:,}" if abs(x) < 2**62 else "2^63 − 1" if x == 2**63 - 1 else f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.0f}" if x.is_integer() else f"{x:g}"
    return str(x)


def _bounds(meta: list[Any], text: bool = False) -> list[str]:
    """Bounds as a reader says them; `text`: lengths of a string are characters, not items."""
    out = []
    lo = next((m.min_length for m in meta if isinstance(m, at.MinLen)), None)
    hi = next((m.max_length for m in meta if isinstance(m, at.MaxLen)), None)
    if text and (lo is not None or hi is not None):
        out.append(f"{_num(lo or 0)}–{_num(hi)} characters" if hi is not None else f"at least {_num(lo)} character(s)")
        meta = [m for m in meta if not isinstance(m, (at.MinLen, at.MaxLen))]
    for m in meta:
        if isinstance(m, at.Gt):
            out.append(f"> {_num(m.gt)}")
        elif isinstance(m, at.Ge):
            out.append(f"≥ {_num(m.ge)}")
        elif isinstance(m, at.Lt):
            out.append(f"< {_num(m.lt)}")
        elif isinstance(m, at.Le):
            out.append(f"≤ {_num(m.le)}")
        elif isinstance(m, at.MinLen):
            out.append(f"at least {_num(m.min_length)} item(s)")
        elif isinstance(m, at.MaxLen):
            out.append(f"at most {_num(m.max_length)} items")
        elif getattr(m, "pattern", None):
            out.append(f"matching `{m.pattern}`")
    return out


def _type(tp: Any, link: dict[type, str], names: dict[type, str] | None = None) -> tuple[str, list[str]]:
    """(how a reader should read the type, the bounds of its inner values)."""
    tp, meta = _unwrap(tp)
    inner = _bounds(meta, text=tp is str)
    if tp is type(None):
        return "null", []
    if typing.get_origin(tp) is Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(tp)), inner
    if _is_union(tp):
        parts, bounds = [], list(inner)
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        for a in args:
            text, b = _type(a, link, names)
            parts.append(text)
            bounds += b
        optional = len(args) < len(typing.get_args(tp))
        return " or ".join(parts) + (" (optional)" if optional else ""), bounds
    origin = typing.get_origin(tp)
    if origin in (list, tuple, set, frozenset):
        args = typing.get_args(tp)
        text, b = _type(args[0], link, names) if args else ("any", [])
        return f"list of {text}", inner + [f"each {x}" for x in b]
    if origin is dict:
        k, v = typing.get_args(tp)
        kt, kb = _type(k, link, names)
        vt, _ = _type(v, link, names)
        return f"map of {kt} to {vt}", inner + [f"keys: {x}" for x in kb]
    if _is_model(tp):
        name = (names or {}).get(tp, "section")
        anchor = link.get(tp)
        return (f"[{name}](#{anchor})" if anchor else name), inner
    if tp is Any:
        return "any", inner
    return getattr(tp, "__name__", str(tp)), inner


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:          # a factory that wants the validated data
            return "—"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        dumped = value.model_dump(mode="json", exclude_defaults=True)
        if not dumped:
            return "—"
        value = dumped.get("value", dumped) if set(dumped) <= {"value", "dist"} else dumped
    if value is None:
        return "unset"
    return f"`{_yaml(value)}`"


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return _num(value).replace(",", "")
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str | None) -> str:
    """A docstring as one table cell."""
    if not text:
        return "*(no description)*"
    return " ".join(text.split()).replace("|", "\\|")


def _anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


# ---------------------------------------------------------------------------------------------
# the page


class _Page:
    def __init__(self, link: dict[type, str], names: dict[type, str]) -> None:
        self.lines: list[str] = []
        self.link = link                 # a model documented once -> its anchor
        self.names = names               # a model documented once -> how a type cell names it
        self.pending: list[tuple[str, type[BaseModel]]] = []

    def table(self, key: str, model: type[BaseModel], skip: tuple[str, ...] = ()) -> None:
        """One table row per field of `model`, whose keys sit under `key`; nested models queued."""
        rows = ["| key | type | default | bounds | description |", "|---|---|---|---|---|"]
        nested: list[tuple[str, type[BaseModel]]] = []
        for name, field in model.model_fields.items():
            if name in skip:
                continue
            full = f"{key}.{name}" if key else name
            bare = _unwrap(field.annotation)[0]
            many = typing.get_origin(bare) is list or any(typing.get_origin(_unwrap(a)[0]) is list
                                                          for a in typing.get_args(bare))
            for m in _models_in(field.annotation):
                if m not in self.link:
                    sub = f"{full}[]" if many else full
                    self.link[m] = _anchor(sub)
                    nested.append((sub, m))
            text, inner = _type(field.annotation, self.link, self.names)
            is_text = bare is str or (_is_union(bare) and str in typing.get_args(bare))
            bounds = _bounds(field.metadata, text=is_text) + inner
            shown = f"`{full}`" if key is not None else f"`{name}`"
            rows.append(f"| {shown} | {text} | {_default(field)} | {', '.join(bounds) or '—'} | "
                        f"{_cell(field.description)} |")
        self.lines += rows + [""]
        self.pending = nested + self.pending

    def nested(self) -> None:
        """The models met in the tables written so far, each once, under the key it was met at."""
        while self.pending:
            key, model = self.pending.pop(0)
            self.lines += [f"### `{key}` {{#{_anchor(key)}}}", ""]
            if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
                self.lines += [" ".join(model.__doc__.split()), ""]
            self.table(key, model)


def _uses(model: type[BaseModel], counts: dict[type, int]) -> None:
    """How many fields, anywhere in the tree, hold each model."""
    for field in model.model_fields.values():
        for m in _models_in(field.annotation):
            counts[m] = counts.get(m, 0) + 1
            if counts[m] == 1:
                _uses(m, counts)


def render() -> str:
    """The reference page, as Markdown."""
    from batchlab.backends import kinds
    from batchlab.run.config import config_model

    model = config_model()
    fields = model.model_fields
    backends = kinds()
    sections = {n: f.annotation for n, f in fields.items() if _is_model(f.annotation)}
    top = [n for n in fields if n not in sections and n != "backend"]

    # A section documents its model; a model held by several fields elsewhere (a length
    # distribution) is documented once, under "Shared value types", and linked from each.
    counts: dict[type, int] = {}
    for m in [*sections.values(), *backends.values()]:
        _uses(m, counts)
    link = {m: _anchor(n) for n, m in sections.items()}
    shared = [m for m, c in counts.items() if c > 1 and m not in link and m not in backends.values()]
    link |= {m: _anchor(f"type {m.__name__}") for m in shared}
    names = {m: m.__name__ for m in shared} | {m: f"`{n}` section" for n, m in sections.items()}
    page = _Page(link, names)

    page.lines += [INTRO, "## Top level {#top-level}", ""]
    page.table("", model, skip=tuple(n for n in fields if n not in top))

    page.lines += ["## `backend` {#backend}", "", _cell(fields["backend"].description), "",
                   "`backend.kind` picks the kind; each kind takes the keys below. A key of another kind "
                   "(`backend.model` with `kind: sim`) is dropped with a `warning:` line, so switching kinds "
                   "with `--set backend.kind=...` keeps working; a key no kind has is refused.", "",
                   "| `kind` | what it is | role |", "|---|---|---|"]
    for kind, options in backends.items():
        role = "engine (batchlab drives it)" if options.role == "engine" else "load target (it batches for itself)"
        page.lines.append(f"| [`{kind}`](#backend-{_anchor(kind)}) | {_cell(options.__doc__)} | {role} |")
    page.lines.append("")
    for kind, options in backends.items():
        page.lines += [f"### `backend` with `kind: {kind}` {{#backend-{_anchor(kind)}}}", ""]
        page.table("backend", options, skip=("kind",))
        page.nested()

    for name, section in sections.items():
        page.lines += [f"## `{name}` {{#{_anchor(name)}}}", "", _cell(fields[name].description), ""]
        page.table(name, section)
        page.nested()

    if shared:
        page.lines += ["## Shared value types {#shared-value-types}", "",
                       "Values of these shapes are asked for under several keys (the type column links here); "
                       "their own keys sit under the key that holds them.", ""]
        for m in shared:
            page.lines += [f"### {m.__name__} {{#{link[m]}}}", ""]
            if m.__doc__:
                page.lines += [" ".join(m.__doc__.split()), ""]
            page.table(None, m)
            page.nested()
    return "\n".join(page.lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# the MkDocs hook


def on_files(files, config):
    """Add the generated page to the site (it lives in no file, so it cannot go stale)."""
    from mkdocs.structure.files import File
    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    print(render(), end="")
