"""Run configuration: YAML in, frozen validated models out.

pydantic does the checking (unknown keys, wrong types, bounds), so every mistake becomes one
line naming the key, e.g. `traffic.rates.0: must be > 0 (got -5)`. `--set a.b=VALUE` overrides
are parsed as YAML scalars, so `--set traffic.rates=[5,10]` and `--set naive.batch_size=8` work.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from batchlab.errors import ConfigError

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class LengthDist(_Model):
    """A token-length distribution. `fixed` uses `value`; `uniform` low..high inclusive;
    `lognormal` has median `median` and shape `sigma`, clipped to [low, high]; `sharegpt`
    samples from a ShareGPT-format JSON file (`path`, counting words as a token estimate)."""
    dist: Literal["fixed", "uniform", "lognormal", "sharegpt"] = "fixed"
    value: PositiveInt | None = None
    low: PositiveInt = 1
    high: PositiveInt | None = None
    median: PositiveFloat | None = None
    sigma: PositiveFloat = 0.5
    path: str | None = None

    @model_validator(mode="after")
    def _check(self):
        need = {"fixed": ["value"], "uniform": ["high"], "lognormal": ["median"], "sharegpt": ["path"]}
        for key in need[self.dist]:
            if getattr(self, key) is None:
                raise ValueError(f"dist '{self.dist}' needs '{key}'")
        if self.high is not None and self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


def _as_length(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("must be a positive integer or a mapping like {dist: uniform, low: 50, high: 300}")
    if isinstance(v, int):
        return {"dist": "fixed", "value": v}
    return v


class BackendConfig(_Model):
    kind: Literal["sim", "hf", "hf-cb", "openai"] = "sim"
    preset: str = "llama2-7b-a100"          # sim: a named model+device preset (backends/presets.py)
    profile: str | None = None              # sim: a measured profile JSON (overrides preset)
    replicas: PositiveInt = 1               # sim: replicas behind a router
    router: Literal["round_robin", "least_outstanding"] = "round_robin"
    model: str | None = None                # hf / openai: hub name or local path / served model name
    dtype: str = "auto"                     # hf: auto | float32 | float16 | bfloat16
    device: str = "auto"                    # hf: auto | cpu | cuda | mps
    threads: PositiveInt | None = None      # hf on CPU: torch intra-op threads (None: torch's default)
    base_url: str | None = None             # openai: e.g. http://127.0.0.1:8000/v1
    api_key: str = "EMPTY"
    memory_budget_bytes: PositiveInt | None = None   # KV budget for the memory trigger (None: from device)
    warmup_batches: Annotated[int, Field(ge=0)] = 2  # real backends: batches run before measuring
    timeout_s: PositiveFloat = 600.0        # openai: per-request timeout
    prompt_format: Literal["tokens", "text"] = "tokens"   # openai: prompt as token ids (exact length) or text
    length_control: Literal["ignore_eos", "generation_config", "none"] = "ignore_eos"  # openai: how exact output lengths are asked for
    max_connections: PositiveInt | None = None  # openai: HTTP connection pool size (None: sized from the trace)


class NaiveConfig(_Model):
    batch_size: PositiveInt = 16            # requests per batch; the batch waits for exactly this many


class DynamicConfig(_Model):
    max_batch_size: PositiveInt = 16        # size trigger and hard cap
    max_wait_ms: NonNegFloat = 50.0         # age trigger: oldest request's wait, milliseconds
    oom_probe_after: PositiveInt = 20       # clean batches before the adaptive cap grows by one


class ContinuousConfig(_Model):
    max_num_seqs: PositiveInt = 256         # sequences in one step
    max_num_batched_tokens: PositiveInt = 8192  # tokens (prefill + decode) in one step
    num_kv_blocks: PositiveInt | None = None    # KV cache size in blocks (None: from the backend's memory)
    block_size: PositiveInt = 16            # tokens per KV block
    chunk_size: PositiveInt | None = None   # chunked prefill: prompt tokens per step per request (None: whole)
    preemption: Literal["recompute", "reserve"] = "recompute"  # out of blocks: preempt newest, or book all up front


class SLOConfig(_Model):
    ttft_s: PositiveFloat | None = None     # seconds
    tpot_s: PositiveFloat | None = None
    e2e_s: PositiveFloat | None = None


class RateStep(_Model):
    """Burst test: the arrival rate switches from the point's rate to `to_rate` at `at_s`,
    and back to the point's rate at `until_s` (None: it stays at `to_rate`)."""
    at_s: PositiveFloat                     # seconds from the run's start
    to_rate: PositiveFloat                  # req/s
    until_s: PositiveFloat | None = None    # seconds from the run's start

    @model_validator(mode="after")
    def _check(self):
        if self.until_s is not None and self.until_s <= self.at_s:
            raise ValueError(f"until_s ({self.until_s}) must be after at_s ({self.at_s})")
        return self


class TrafficConfig(_Model):
    arrival: Literal["poisson", "gamma", "constant", "trace"] = "poisson"
    burstiness: PositiveFloat = 1.0         # gamma shape: 1 = Poisson, < 1 burstier
    trace_file: str | None = None           # CSV: arrival_time, prompt_len, output_len
    rates: list[PositiveFloat] = Field(default_factory=lambda: [5.0, 20.0, 50.0], min_length=1)  # req/s
    duration_s: PositiveFloat = 60.0        # traffic per point, after warm-up
    warmup_s: NonNegFloat = 5.0             # arrivals in the first warmup_s are excluded from metrics
    seed: int = 0
    repeats: PositiveInt = 1
    prompt_len: LengthDist = LengthDist(dist="fixed", value=128)
    output_len: LengthDist = LengthDist(dist="fixed", value=128)
    rate_step: RateStep | None = None

    _lengths = field_validator("prompt_len", "output_len", mode="before")(_as_length)

    @model_validator(mode="after")
    def _check(self):
        if self.arrival == "trace" and not self.trace_file:
            raise ValueError("arrival 'trace' needs traffic.trace_file")
        return self


# "server": the backend batches for itself (an OpenAI-compatible server, transformers' own
# continuous batching); batchlab only sends the trace and measures.
Strategy = Literal["naive", "dynamic", "continuous", "server"]
SERVER_KINDS = ("openai", "hf-cb")


class RunConfig(_Model):
    name: str = "batchlab"
    backend: BackendConfig = BackendConfig()
    strategies: list[Strategy] = Field(default_factory=lambda: ["naive", "dynamic", "continuous"], min_length=1)
    naive: NaiveConfig = NaiveConfig()
    dynamic: DynamicConfig = DynamicConfig()
    continuous: ContinuousConfig = ContinuousConfig()
    traffic: TrafficConfig = TrafficConfig()
    slo: SLOConfig = SLOConfig()
    out: str = "results/latest"
    report: bool = True                     # write report.md and plots at the end of `run`

    @model_validator(mode="after")
    def _strategies_fit_backend(self):
        server = self.backend.kind in SERVER_KINDS
        wrong = [s for s in self.strategies if (s == "server") != server]
        if wrong:
            need = "[server]" if server else "naive, dynamic and/or continuous"
            raise ValueError(f"strategies: backend.kind '{self.backend.kind}' takes {need}, not {', '.join(wrong)}")
        return self

    def knobs(self, strategy: str) -> dict[str, Any]:
        """The settings that shape one strategy's run, flattened for CSV rows and reports."""
        if strategy == "server":
            knobs = {"backend.model": self.backend.model, "backend.base_url": self.backend.base_url}
            if self.backend.kind == "hf-cb":   # transformers' manager runs under our budgets
                knobs |= {f"continuous.{k}": v for k, v in self.continuous.model_dump().items()}
            return knobs
        section = getattr(self, strategy).model_dump()
        return {f"{strategy}.{k}": v for k, v in section.items()}


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "tagged-")))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        got = e.get("input")
        tail = "" if e["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{loc or 'config'}: {msg}{tail}")
    return "; ".join(lines)


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: '{k}' is not a section")
        node = nxt
    node[keys[-1]] = value


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {key}: cannot parse {raw!r}: {e}") from None
        out.append((key.strip(), value))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> RunConfig:
    """Read YAML (or start from `base`/defaults), apply `--set` overrides, validate."""
    tree: dict = dict(base or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        tree = loaded
    for key, value in parse_overrides(list(overrides)):
        _set_path(tree, key, value)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        where = f"{path}: " if path else ""
        raise ConfigError(where + _format_error(e)) from None


def default_config_text() -> str:
    """The packaged default sweep (batchlab/data/default.yaml; configs/sim.yaml is a copy)."""
    return resources.files("batchlab").joinpath("data/default.yaml").read_text()


def load_user_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """What a command line means: CONFIG if given, else the packaged default sweep, then --set.
    The one place the default config is read (run, serve, profile and the benchmarks call it)."""
    base = None if path is not None else yaml.safe_load(default_config_text())
    return load_config(path, list(overrides), base=base)
