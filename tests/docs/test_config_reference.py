"""The config reference (docs/hooks/config_reference.py, an MkDocs hook) is generated from the
schema: every field of every section and of every backend kind, with its docstring."""
from __future__ import annotations

import importlib.util

from pydantic import BaseModel

from tests.docs.shell import ROOT


def reference():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fields(model: type[BaseModel], key: str, seen: set) -> list[tuple[str, object]]:
    """(dotted key, FieldInfo) for every field under `model`, nested sections included."""
    out = []
    for name, f in model.model_fields.items():
        out.append((f"{key}.{name}" if key else name, f))
        for m in reference()._models_in(f.annotation):
            if m not in seen:
                seen.add(m)
                out += fields(m, f"{key}.{name}" if key else name, seen)
    return out


def every_field() -> list[tuple[str, object]]:
    from batchlab.backends import kinds
    from batchlab.run.config import config_model
    model = config_model()
    # a backend kind, and a section (`slo`, also held by a traffic class), is documented once, where it is
    seen: set = set(kinds().values()) | {f.annotation for f in model.model_fields.values() if isinstance(f.annotation, type)}
    out = [(k, f) for k, f in fields(model, "", seen) if not k.startswith("backend")]
    for name, f in model.model_fields.items():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            out += fields(f.annotation, name, seen)
    for options in kinds().values():
        out += fields(options, "backend", seen)
    return out


def test_every_field_has_a_docstring():
    """The reference's descriptions are the fields' docstrings: a field without one is a key nobody
    can look up (`kind`, the discriminator, is described by its model's docstring)."""
    missing = sorted({k for k, f in every_field() if not f.description and not k.endswith(".kind")})
    assert not missing, "fields with no docstring (write one under the field):\n" + "\n".join(missing)


def test_the_page_lists_every_key_with_its_description():
    page = reference().render()
    keys = page.replace("[]", "")            # list items' keys read `traffic.classes[].name`
    for key, f in every_field():
        if key.endswith(".kind"):
            continue
        leaf = key.rsplit(".", 1)[-1]
        assert f"`{key}`" in keys or f"| `{leaf}` |" in page, key
        if f.description:
            assert " ".join(f.description.split()).replace("|", "\\|") in page, key


def test_a_plugin_registered_at_run_time_appears_with_its_section_and_kind():
    from batchlab import backends, schedulers
    from tests.run.plugins import MetronomeOptions, PairsScheduler
    backends.register(MetronomeOptions)
    schedulers.register(PairsScheduler)
    try:
        page = reference().render()
    finally:
        backends.unregister("metronome")
        schedulers.unregister("pairs")
    assert "### `backend` with `kind: metronome`" in page and "| `backend.tick_s` | float | `0.01` | > 0 | Seconds per step. |" in page
    assert "## `pairs`" in page and "Wait for a partner; False: run whatever is waiting at once." in page
    assert "metronome" not in reference().render()


def test_types_defaults_and_bounds_read_as_a_person_would_write_them():
    page = reference().render()
    assert "| `traffic.rates` | list of float | `[5, 20, 50]` | at least 1 item(s), at most 1,000 items, each > 0, each ≤ 100,000 |" in page
    assert "| `continuous.preemption` | `recompute` \\| `reserve` | `recompute` | — |" in page
    assert "| `traffic.prompt_len` | [LengthDist](#type-lengthdist) | `128` |" in page
    assert "| `traffic.classes[].slo` | [`slo` section](#slo) (optional) | unset |" in page
