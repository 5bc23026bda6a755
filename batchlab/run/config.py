"""The whole run's config model, assembled from the registries, and what a command line means.

core/config holds the sections every run has. Each registered scheduler with options adds its
section, named after it (schedulers/); each registered backend kind adds a member to `backend`, a
union discriminated on `kind` (backends/). Nothing here names a strategy or a kind. A key that the
chosen kind lacks but another kind reads (`backend.model` on the simulator) is dropped with a
warning, so switching kinds with --set keeps working; a key no kind reads is refused. Keys the run
will not read (a load target's scheduler sections, a trace's rates) earn a warning line too.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import Field, ValidationError, create_model, model_validator

from batchlab.backends import TARGET, BackendOptions, kinds
from batchlab.backends.baselines import BASELINES, baselines_model
from batchlab.core.config import RunConfig, TrafficConfig, format_error
from batchlab.core.config.load import user_tree
from batchlab.errors import ConfigError
from batchlab.schedulers import option_sections

_MODELS: dict[tuple, type[RunConfig]] = {}


class _Run(RunConfig):
    """The checks that need the backend: its role decides which strategies it takes."""

    @model_validator(mode="before")
    @classmethod
    def _other_kinds_keys(cls, data: Any) -> Any:
        """Default the kind to the simulator; drop keys of other kinds (config_warnings names them)."""
        if not isinstance(data, dict) or not isinstance(data.get("backend", {}), dict):
            return data
        backend = {"kind": "sim"} | data.get("backend", {})
        known = kinds()
        # NOTE: a kind that is not a string (a list, a number) is left for the model to refuse in one line
        chosen = known.get(backend["kind"]) if isinstance(backend["kind"], str) else None
        if chosen is not None:
            others = {f for k, m in known.items() if m is not chosen for f in m.model_fields} - set(chosen.model_fields)
            backend = {k: v for k, v in backend.items() if k not in others}
        return data | {"backend": backend}

    @model_validator(mode="after")
    def _strategies_fit_backend(self):
        b = self.backend
        if b.role == TARGET:
            wrong = [s for s in self.strategies if s != b.strategy]
            need = f"[{b.strategy}] (it batches for itself)"
        else:
            wrong = [s for s in self.strategies if s in target_strategies()
                     or (s in BASELINES and not b.hosts_baselines)]
            need = f"{', '.join(option_sections())} or a policy's import path"
            if b.hosts_baselines:
                need += f", or a managed baseline ({', '.join(BASELINES)})"
            elif any(s in BASELINES for s in wrong):
                need += f" (managed baselines such as {', '.join(BASELINES)} need a model's files: backend.kind hf)"
        if wrong:
            raise ValueError(f"strategies: backend.kind '{b.kind}' takes {need}, not {', '.join(wrong)}")
        return self

    @model_validator(mode="after")
    def _one_loop_one_process(self):
        # NOTE: a closed loop's users are numbered by their place in one process's list, and each
        # user's next request depends on its last answer: it is not split (yet)
        if self.loadgen.workers > 1 and self.traffic.arrival == "closed":
            raise ValueError("loadgen.workers: a closed loop is sent by one process; set loadgen.workers=1")
        return self

    @model_validator(mode="after")
    def _sessions_need_a_driver(self):
        # NOTE: a session's next turn exists only once its previous answer finished, which the
        # driver sees (run/driver.py, run/replicas.py); a load target sends a fixed trace by
        # itself, so it cannot close the loop (yet).
        if self.traffic.sessions is not None and self.backend.role == TARGET:
            raise ValueError(f"traffic.sessions: not supported with backend.kind '{self.backend.kind}' (it sends "
                             "a fixed trace itself); use an engine (backend.kind sim or hf)")
        return self


def config_model() -> type[RunConfig]:
    """The run's config model for the registries as they are now (rebuilt when they change)."""
    backends, sections = kinds(), option_sections()
    key = (tuple(backends.items()), tuple(sections.items()))
    if key not in _MODELS:
        members = tuple(backends.values())
        union = Annotated[Union[members], Field(discriminator="kind")] if len(members) > 1 else members[0]  # noqa: UP007
        fields: dict[str, Any] = {"backend": (union, Field(default_factory=backends["sim"],
                                                           description="What runs the requests (its `kind`)."))}
        for name, model in sections.items():
            fields[name] = (model, Field(default_factory=model, description=model.__doc__))
        section = baselines_model()
        fields["baselines"] = (section, Field(default_factory=section, description=section.__doc__))
        _MODELS[key] = create_model("RunConfig", __base__=_Run, __module__=__name__, **fields)
    return _MODELS[key]


def validate(tree: dict, where: str = "") -> RunConfig:
    """A config tree checked into the run's model; ConfigError (one line) naming every bad key."""
    try:
        return config_model().model_validate(tree)
    except ValidationError as e:
        raise ConfigError(where + format_error(e, tags={"backend": kinds()})) from None
    except RecursionError:
        raise ConfigError(f"{where or 'config: '}nested too deeply") from None


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> RunConfig:
    """Read YAML (or start from `base`/defaults), apply `--set` overrides, validate.
    Every mistake is a ConfigError with one line; `config_warnings(cfg)` lists ignored keys."""
    tree, given = user_tree(path, list(overrides), base)
    cfg = validate(tree, f"{path}: " if path else "")
    cfg._given = frozenset(given)
    return cfg


def default_config_text() -> str:
    """The packaged default sweep (batchlab/data/default.yaml; configs/sim.yaml is a copy)."""
    return resources.files("batchlab").joinpath("data/default.yaml").read_text()


def load_user_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """What a command line means: CONFIG if given, else the packaged default sweep, then --set.
    The one place the default config is read (run, serve, profile, tune and the benchmarks call it)."""
    base = None if path is not None else yaml.safe_load(default_config_text())
    return load_config(path, list(overrides), base=base)


def target_strategies() -> set[str]:
    """The strategy names load targets record their runs under (`server`)."""
    return {m.strategy for m in kinds().values() if m.role == TARGET}


def config_warnings(cfg: RunConfig) -> list[str]:
    """One line per key the user set that this run will not read (print as `warning: ...`)."""
    given = cfg._given if cfg._given is not None else _set_keys(cfg)
    out = []
    for key in sorted(given):
        section, _, rest = key.partition(".")
        name = rest.split(".")[0]
        reason = _ignored(cfg, section, name, key)
        if reason:
            shown = key if section in option_sections() else f"{section}.{name}"   # a whole backend or traffic key
            out.append(f"{shown} does not apply {reason} (ignored)")
    return list(dict.fromkeys(out))


def _ignored(cfg: RunConfig, section: str, name: str, key: str) -> str | None:
    """Why `key` does not apply to this run, or None."""
    b: BackendOptions = cfg.backend
    sections = option_sections()
    if section == "backend":
        return None if not name or name in type(b).model_fields else f"to backend.kind '{b.kind}'"
    if section in sections and b.role == TARGET:
        honoured = b.reads.get(section, ())
        if honoured is None or (name and name in honoured):
            return None
        return f"to backend.kind '{b.kind}'"
    if section in sections and _policy_section_unused(cfg, section):
        return f": '{section}' is not among the strategies"
    if section == "traffic":
        return _traffic_ignores(cfg.traffic, name)
    if section == "loadgen" and b.role != TARGET and not any(s in BASELINES for s in cfg.strategies):
        return f"to backend.kind '{b.kind}' (no server is sent a trace: it runs in this process)"
    if key == "loadgen.kind" and cfg.loadgen.workers == 1:
        return "with loadgen.workers 1 (the trace is sent by this process)"
    return None


def _policy_section_unused(cfg: RunConfig, section: str) -> bool:
    """A policy's own section (a scheduler that runs under another's budgets) while it does not run.
    NOTE: the baselines' sections (naive, dynamic, continuous) sit in nearly every config file,
    whichever strategies a command line picks: they earn no warning."""
    from batchlab.schedulers import SCHEDULERS
    cls = SCHEDULERS.get(section)
    return cls is not None and bool(cls.runs_under) and section not in cfg.strategies


def _traffic_ignores(t: TrafficConfig, name: str) -> str | None:
    if t.arrival == "trace" and name in ("rates", "prompt_len", "output_len", "rate_step", "burstiness", "seed"):
        return "to arrival 'trace' (the file sets arrivals and lengths)"
    if name == "burstiness" and t.arrival != "gamma":
        return f"to arrival '{t.arrival}' (only gamma has a shape)"
    if name == "rates" and t.arrival == "closed":
        return "to arrival 'closed' (its points are traffic.concurrency's user counts)"
    if name == "concurrency" and t.arrival != "closed":
        return f"to arrival '{t.arrival}' (set traffic.arrival=closed for a closed loop)"
    if name in ("trace_file", "replay") and t.arrival != "trace":
        return f"to arrival '{t.arrival}' (set traffic.arrival=trace to replay it)"
    return None


def _set_keys(model, prefix: str = "") -> set[str]:
    from pydantic import BaseModel
    keys = set()
    for name in model.model_fields_set:
        value = getattr(model, name)
        keys |= _set_keys(value, f"{prefix}{name}.") if isinstance(value, BaseModel) else {prefix + name}
    return keys
