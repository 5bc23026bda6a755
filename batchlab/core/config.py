"""Run configuration: YAML in, frozen validated models out.

pydantic does the checking (unknown keys, wrong types, bounds), so every mistake becomes one
line naming the key, e.g. `traffic.rates.0: must be > 0 (got -5)`. `--set a.b=VALUE` overrides
are parsed as YAML scalars, so `--set traffic.rates=[5,10]` and `--set naive.batch_size=8` work.
Every number is finite and bounded (the MAX_* constants below), and one sweep point may generate
at most MAX_REQUESTS_PER_POINT requests and MAX_TOKENS_PER_POINT tokens: a typo such as
`rates=[1e9]` is refused here instead of allocating until the machine runs out of memory.
Keys that the chosen backend ignores are not errors but warnings (`config_warnings`).
"""
from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from batchlab.core.limits import (
    MAX_BATCH,
    MAX_LENGTH,
    MAX_SECONDS,
    MIN_RATE,
    BatchSize,
    Rate,
    Seconds,
    Tokens,
    check_point_size,
)
from batchlab.errors import ConfigError

# Config keys whose values are never echoed in an error line (they may hold a secret).
_SECRET_KEYS = ("api_key", "api_key_env", "base_url")


class _Model(BaseModel):
    # NOTE: allow_inf_nan=False: an inf or NaN anywhere would turn into an endless arrival loop or
    # a NaN step time; pydantic refuses them with "Input should be a finite number".
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)


class LengthDist(_Model):
    """A token-length distribution. `fixed` uses `value`; `uniform` low..high inclusive;
    `lognormal` has median `median` and shape `sigma`, clipped to [low, high] (high unset:
    MAX_LENGTH); `sharegpt` samples from a ShareGPT-format JSON file (`path`, counting words as
    a token estimate)."""
    dist: Literal["fixed", "uniform", "lognormal", "sharegpt"] = "fixed"
    value: Tokens | None = None
    low: Tokens = 1
    high: Tokens | None = None
    median: Annotated[float, Field(gt=0, le=MAX_LENGTH)] | None = None
    sigma: Annotated[float, Field(gt=0, le=10)] = 0.5
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

    def mean(self) -> float:
        """Expected tokens per request. For `sharegpt` only a lower bound (`low`) before the file
        is read; core/traffic.check_inputs redoes the check with the file's real lengths."""
        if self.dist == "fixed":
            return float(self.value)
        if self.dist == "uniform":
            return (self.low + self.high) / 2
        if self.dist == "lognormal":
            return _clipped_lognormal_mean(self.median, self.sigma, self.low, self.high or MAX_LENGTH)
        return float(self.low)


def _clipped_lognormal_mean(median: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X lognormal with the given median and sigma (closed form)."""
    mu = math.log(median)
    cdf = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    inside = math.exp(mu + sigma**2 / 2) * (cdf(b - sigma) - cdf(a - sigma))
    return lo * cdf(a) + inside + hi * (1 - cdf(b))


def _as_length(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("must be a positive integer or a mapping like {dist: uniform, low: 50, high: 300}")
    if isinstance(v, int):
        return {"dist": "fixed", "value": v}
    return v


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BackendConfig(_Model):
    kind: Literal["sim", "hf", "hf-cb", "openai"] = "sim"
    preset: str = "llama2-7b-a100"          # sim: a named model+device preset (backends/presets.py)
    profile: str | None = None              # sim: a measured profile JSON (overrides preset)
    replicas: Annotated[int, Field(gt=0, le=1024)] = 1   # sim: replicas behind a router
    router: Literal["round_robin", "least_outstanding", "cache_aware"] = "round_robin"
    model: str | None = None                # hf / openai: hub name or local path / served model name
    dtype: Literal["auto", "float32", "fp32", "float16", "fp16", "bfloat16", "bf16"] = "auto"  # hf
    device: str = "auto"                    # hf: auto | cpu | cuda | cuda:N | mps
    threads: Annotated[int, Field(gt=0, le=1024)] | None = None  # hf on CPU: torch intra-op threads (None: torch's default)
    base_url: str | None = None             # openai: e.g. http://127.0.0.1:8000/v1
    # openai: the environment variable holding the API key (None: OPENAI_API_KEY if set, else no
    # key). NOTE: the key itself never goes in a config: config.yaml is written next to results.
    api_key_env: str | None = None
    memory_budget_bytes: Annotated[int, Field(gt=0, le=1 << 50)] | None = None  # KV budget for the memory trigger (None: from device)
    warmup_batches: Annotated[int, Field(ge=0, le=1000)] = 2  # real backends: batches run before measuring
    # hf continuous (step engine): decode-only passes padded to row buckets and run through
    # torch.compile (plus CUDA graphs on CUDA), compiled at start-up; mixed steps stay eager
    compile: bool = False
    timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 600.0   # openai: per-request timeout
    prompt_format: Literal["tokens", "text"] = "tokens"   # openai: prompt as token ids (exact length) or text
    length_control: Literal["ignore_eos", "generation_config", "none"] = "ignore_eos"  # openai: how exact output lengths are asked for
    max_connections: Annotated[int, Field(gt=0, le=MAX_BATCH)] | None = None  # openai: HTTP connection pool size (None: sized from the trace)

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError("api_key is never read from a config file or --set (it would be written to "
                             "config.yaml): export OPENAI_API_KEY, or put the key in another variable and name "
                             "that variable with backend.api_key_env")
        return data

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.fullmatch(v):
            raise ValueError("must name an environment variable (letters, digits, _), not hold the key itself")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d{1,3})?", v):
            raise ValueError("expected auto, cpu, cuda, cuda:N or mps")
        return v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = re.fullmatch(r"https?://([^/@\s]+@)?[^/@\s]+(/\S*)?", v)
        if not m:
            raise ValueError("expected http://HOST[:PORT]/PATH, e.g. http://127.0.0.1:8000/v1")
        if m.group(1):
            raise ValueError("credentials in the URL would be written to config.yaml; put the key in "
                             "OPENAI_API_KEY (or the variable backend.api_key_env names)")
        return v


class NaiveConfig(_Model):
    batch_size: BatchSize = 16              # requests per batch; the batch waits for exactly this many


class DynamicConfig(_Model):
    max_batch_size: BatchSize = 16          # size trigger and hard cap
    max_wait_ms: Annotated[float, Field(ge=0, le=MAX_SECONDS * 1000)] = 50.0  # age trigger: oldest request's wait, milliseconds
    oom_probe_after: Annotated[int, Field(gt=0, le=1_000_000)] = 20   # clean batches before the adaptive cap grows by one


class ContinuousConfig(_Model):
    max_num_seqs: BatchSize = 256           # sequences in one step
    max_num_batched_tokens: Annotated[int, Field(gt=0, le=1 << 24)] = 8192  # tokens (prefill + decode) in one step
    num_kv_blocks: Annotated[int, Field(gt=0, le=1 << 24)] | None = None   # KV cache size in blocks (None: from the backend's memory)
    block_size: Tokens = 16                 # tokens per KV block
    chunk_size: Tokens | None = None        # chunked prefill: prompt tokens per step per request (None: whole)
    preemption: Literal["recompute", "reserve"] = "recompute"  # out of blocks: preempt newest, or book all up front
    prefix_caching: bool = False            # reuse KV blocks of equal prompt prefixes (vLLM's automatic prefix caching)


class SLOConfig(_Model):
    ttft_s: Seconds | None = None           # seconds
    tpot_s: Seconds | None = None
    e2e_s: Seconds | None = None


class RateStep(_Model):
    """Burst test: the arrival rate switches from the point's rate to `to_rate` at `at_s`,
    and back to the point's rate at `until_s` (None: it stays at `to_rate`)."""
    at_s: Seconds                           # seconds from the run's start
    to_rate: Rate                           # req/s
    until_s: Seconds | None = None          # seconds from the run's start

    @model_validator(mode="after")
    def _check(self):
        if self.until_s is not None and self.until_s <= self.at_s:
            raise ValueError(f"until_s ({self.until_s}) must be after at_s ({self.at_s})")
        if self.to_rate < MIN_RATE:
            raise ValueError(f"to_rate must be at least {MIN_RATE:g} req/s (got {self.to_rate:g})")
        return self


class ReplayConfig(_Model):
    """How a trace file is read and replayed (core/trace_formats.py). Times are the file's,
    relative to its earliest request; the window is cut first, then scaled."""
    format: Literal["auto", "batchlab", "azure", "burstgpt", "mooncake"] = "auto"   # auto: from the header
    start_s: Annotated[float, Field(ge=0, le=MAX_SECONDS * 1000)] = 0.0   # skip the file's first start_s seconds
    duration_s: Annotated[float, Field(gt=0, le=MAX_SECONDS * 1000)] | None = None   # then keep this many (None: all)
    time_scale: Annotated[float, Field(gt=0, le=1e6)] = 1.0   # multiply gaps: 0.5 replays twice as fast
    model: str | None = None                # burstgpt: keep rows of this Model (e.g. ChatGPT, GPT-4)
    log_type: str | None = None             # burstgpt: keep rows of this Log Type (e.g. "Conversation log")
    block_size: Tokens = 512                # mooncake: prompt tokens per hash id (Mooncake's traces: 512)


class PrefixConfig(_Model):
    """Shared system prompts: `groups` prompts of `tokens` tokens each; a request picks group g
    (0-based) with probability proportional to 1 / (g + 1)^zipf, then adds its own message of
    traffic.prompt_len tokens (at most MAX_LENGTH - tokens: a prompt stays within MAX_LENGTH)."""
    groups: Annotated[int, Field(gt=0, le=1_000_000)] = 8
    tokens: Annotated[int, Field(gt=0, lt=MAX_LENGTH)] = 1024   # tokens of each group's shared prompt
    zipf: Annotated[float, Field(ge=0, le=10)] = 1.0   # popularity skew: 0 = every group equally likely


class SessionsConfig(_Model):
    """Multi-turn conversations: a session starts at each arrival of the rate's process and
    sends `turns` requests; turn k+1 is sent think time after turn k's answer finished (a closed
    loop per session), its prompt being the whole conversation so far plus a new message."""
    turns: Annotated[int, Field(gt=0, le=1000)] = 4
    think_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 5.0    # mean seconds between answer and next turn
    think: Literal["exponential", "fixed"] = "exponential"         # think-time distribution
    message_len: LengthDist = LengthDist(dist="fixed", value=64)   # tokens of each later turn's new message

    _lengths = field_validator("message_len", mode="before")(_as_length)


class TrafficClass(_Model):
    """One class of traffic (traffic.classes): a share of the arrivals with its own lengths, who
    sends it (`tenant`), how urgent it is (`priority`, lower first, as vLLM's) and, optionally,
    its own SLO. `weight`: its share of each point's rate; `rate`: instead, its own Poisson
    stream of that many req/s whatever the point's rate (a fixed background load)."""
    name: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_.-]+$")]
    weight: Annotated[float, Field(gt=0, le=1e6)] | None = None
    rate: Rate | None = None                 # req/s
    prompt_len: LengthDist | None = None     # None: traffic.prompt_len
    output_len: LengthDist | None = None     # None: traffic.output_len
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    tenant: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_.-]+$")] | None = None  # None: the class's name
    slo: SLOConfig | None = None             # None: the run's slo

    _lengths = field_validator("prompt_len", "output_len", mode="before")(_as_length)

    @model_validator(mode="after")
    def _check(self):
        if (self.weight is None) == (self.rate is None):
            raise ValueError(f"class '{self.name}': give exactly one of weight (a share of the point's rate) "
                             "or rate (its own req/s)")
        if self.rate is not None and self.rate < MIN_RATE:
            raise ValueError(f"class '{self.name}': rate must be at least {MIN_RATE:g} req/s (got {self.rate:g})")
        return self

    @property
    def who(self) -> str:
        return self.tenant or self.name


# Traffic keys added after results directories existed: left out of a config's dump (and so of
# experiment digests and point hashes) while unset, so a sweep that does not use them keeps the
# directory and the rows it always had.
_OPTIONAL_TRAFFIC = ("replay", "prefix", "sessions", "classes")


class TrafficConfig(_Model):
    arrival: Literal["poisson", "gamma", "constant", "trace"] = "poisson"
    burstiness: Annotated[float, Field(ge=0.01, le=1000)] = 1.0   # gamma shape: 1 = Poisson, < 1 burstier
    trace_file: str | None = None           # CSV: arrival_time, prompt_len, output_len
    rates: list[Rate] = Field(default_factory=lambda: [5.0, 20.0, 50.0], min_length=1, max_length=1000)  # req/s
    duration_s: Seconds = 60.0              # traffic per point, after warm-up
    warmup_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 5.0  # arrivals in the first warmup_s are excluded from metrics
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    repeats: Annotated[int, Field(gt=0, le=1000)] = 1
    prompt_len: LengthDist = LengthDist(dist="fixed", value=128)
    output_len: LengthDist = LengthDist(dist="fixed", value=128)
    rate_step: RateStep | None = None
    replay: ReplayConfig | None = None      # trace files: format, window, time scale, filters
    prefix: PrefixConfig | None = None      # shared system prompts
    sessions: SessionsConfig | None = None  # multi-turn conversations (closed loop per session)
    classes: list[TrafficClass] | None = Field(default=None, min_length=1, max_length=64)  # tenants, priorities, job mixes

    _lengths = field_validator("prompt_len", "output_len", mode="before")(_as_length)

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        tree = handler(self)
        for key in _OPTIONAL_TRAFFIC:
            if isinstance(tree, dict) and tree.get(key, 0) is None:
                del tree[key]
        return tree

    @model_validator(mode="after")
    def _check(self):
        if self.arrival == "trace" and not self.trace_file:
            raise ValueError("arrival 'trace' needs traffic.trace_file")
        if self.classes is not None:
            names = [c.name for c in self.classes]
            if len(set(names)) < len(names):
                raise ValueError(f"classes: each class name may be used once (got {', '.join(names)})")
            if self.sessions is not None:
                raise ValueError("classes cannot be combined with sessions (yet): a session's turns would need a class each")
            if all(c.weight is None for c in self.classes):
                raise ValueError("classes: at least one class needs a weight (a share of the point's rate, "
                                 "which the sweep varies)")
        if self.arrival == "trace":
            for key in ("prefix", "sessions", "classes"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} makes synthetic traffic and cannot be combined with arrival 'trace' "
                                     "(a Mooncake trace's hash_ids carry its own shared prefixes)")
            return self                     # the file sets the load: core/trace_formats caps it
        for i, rate in enumerate(self.rates):
            if rate < MIN_RATE:
                raise ValueError(f"rates.{i}: must be at least {MIN_RATE:g} req/s (got {rate:g})")
            if rate in self.rates[:i]:
                raise ValueError(f"rates.{i}: {rate:g} req/s is listed twice")
            check_point_size(self.expected_requests(rate), self.expected_requests(rate) * self.mean_tokens(), rate)
        return self

    @property
    def horizon_s(self) -> float:
        """Seconds of arrivals in one point: warm-up plus measured traffic."""
        return self.warmup_s + self.duration_s

    def expected_requests(self, rate: float) -> float:
        """Mean number of arrivals in one point at `rate` req/s, a rate step's to_rate included;
        with sessions, at most `turns` requests per session started."""
        step = self.rate_step
        fixed = sum(c.rate for c in self.classes or () if c.rate is not None) * self.horizon_s
        if step is None or step.at_s >= self.horizon_s:
            starts = rate * self.horizon_s
        else:
            inside = min(step.until_s or self.horizon_s, self.horizon_s) - step.at_s
            starts = rate * (self.horizon_s - inside) + step.to_rate * inside
        return fixed + starts * (self.sessions.turns if self.sessions else 1)

    def mean_tokens(self) -> float:
        """Expected prompt + output tokens of one request (an upper bound with sessions: every
        session is counted as running all its turns; with classes, the longest class's)."""
        if self.classes:
            return max((c.prompt_len or self.prompt_len).mean() + (c.output_len or self.output_len).mean()
                       for c in self.classes) + (self.prefix.tokens if self.prefix else 0)
        first = self.prompt_len.mean() + (self.prefix.tokens if self.prefix else 0)
        out = self.output_len.mean()
        if not self.sessions:
            return first + out
        # NOTE: turn k's prompt holds every earlier prompt, answer and message: the mean over T
        # turns of first + (k - 1) (out + message), plus the answer.
        t, msg = self.sessions.turns, self.sessions.message_len.mean()
        return first + (t - 1) / 2 * (out + msg) + out


class PriorityConfig(_Model):
    """Iteration-level priority (traffic.classes' `priority`, lower first): admission by priority,
    then arrival; out of room, the lowest-priority running request is preempted, as vLLM's
    `--scheduling-policy priority` does."""
    preempt: bool = True                    # preempt lower priority running requests for a waiting higher one


class SJFConfig(_Model):
    """Shortest predicted remaining output first, with an aging cap: a request that has waited
    `aging_s` goes ahead of every younger one (first come, first served among the aged)."""
    aging_s: Annotated[float, Field(gt=0, le=MAX_SECONDS)] = 5.0
    predictor: Literal["oracle", "noisy"] = "oracle"   # oracle: the true output length
    error: Annotated[float, Field(gt=0, le=10)] = 0.5  # noisy: mean absolute relative error of the guess
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0   # noisy: the predictor's own seed


class VTCConfig(_Model):
    """Virtual token counter fair share across tenants (Sheng et al., "Fairness in Serving Large
    Language Models", OSDI 2024): admit from the tenant that has received the least weighted
    service; a tenant returning from idle is lifted to the least backlogged counter."""
    prefill_weight: Annotated[float, Field(gt=0, le=1000)] = 1.0   # the paper's w_p per prompt token
    decode_weight: Annotated[float, Field(gt=0, le=1000)] = 2.0    # the paper's w_q per output token


class ExecutorConfig(_Model):
    """Where a sweep's points run (run/executors.py). `local`: one after another in this process.
    `ray`: each point is a Ray task; the process that started the sweep writes every result.
    NOTE: where points run never changes what they mean, so this section is left out of
    experiment identities, point hashes and config.yaml; setup.json records the placement."""
    kind: Literal["local", "ray"] = "local"
    address: str | None = None              # ray: a cluster's address, or "auto" (None: $RAY_ADDRESS, else a local Ray here)
    num_cpus: Annotated[int, Field(gt=0, le=1 << 16)] | None = None   # ray, started here: CPUs it may use (None: all)
    max_retries: Annotated[int, Field(ge=0, le=100)] = 2   # ray: reruns of a point whose worker died

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"auto|local|(ray://)?[A-Za-z0-9_.\-\[\]:]+(:\d{1,5})?", v):
            raise ValueError("expected auto, HOST:PORT or ray://HOST:PORT")
        return v


class ValidateConfig(_Model):
    """`batchlab validate`'s held-out workloads (calibrate/validate.py). The config's own traffic is
    the workload `base`; each entry here names another, given as `traffic` keys that replace the
    base's (e.g. longer prompts, a bursty gamma trace). The profiles never see any of them: they are
    fitted on closed bursts, so every cell validate judges is held out by construction."""
    workloads: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")], dict[str, Any]] = Field(
        default_factory=dict, max_length=16)
    noise: bool = True                      # run the real backend twice on the same traces (the noise floor)
    saturation: bool = True                 # a burst per strategy: throughput where the backend, not the trace, sets it
    drift: bool = True                      # time a reference burst around the runs; scale the profile by the machine's speed now

    @field_validator("workloads")
    @classmethod
    def _not_base(cls, v: dict) -> dict:
        if "base" in v:
            raise ValueError("'base' is the config's own traffic; name the held-out workloads otherwise")
        return v


# "server": the backend batches for itself (an OpenAI-compatible server, transformers' own
# continuous batching); batchlab only sends the trace and measures. Policies run on the continuous
# machinery; a third-party one is named by import path (`pkg.module:Class`) or by its entry point
# in the `batchlab.schedulers` group (schedulers/plugins.py).
BUILTIN_STRATEGIES = ("naive", "dynamic", "continuous", "priority", "sjf", "vtc", "server")
POLICIES = ("priority", "sjf", "vtc")
STRATEGY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*(:[A-Za-z_][A-Za-z0-9_]*)?$"   # a name, or pkg.module:Class
Strategy = Annotated[str, Field(min_length=1, max_length=200, pattern=STRATEGY_PATTERN)]
SERVER_KINDS = ("openai", "hf-cb")


class RunConfig(_Model):
    name: str = "batchlab"
    backend: BackendConfig = BackendConfig()
    strategies: list[Strategy] = Field(default_factory=lambda: ["naive", "dynamic", "continuous"], min_length=1)
    naive: NaiveConfig = NaiveConfig()
    dynamic: DynamicConfig = DynamicConfig()
    continuous: ContinuousConfig = ContinuousConfig()
    priority: PriorityConfig = PriorityConfig()
    sjf: SJFConfig = SJFConfig()
    vtc: VTCConfig = VTCConfig()
    traffic: TrafficConfig = TrafficConfig()
    slo: SLOConfig = SLOConfig()
    out: str = "results/latest"
    report: bool = True                     # write report.md and plots at the end of `run`
    executor: ExecutorConfig = ExecutorConfig()   # where points run; not part of what they mean
    validation: ValidateConfig = ValidateConfig()   # `batchlab validate` only: held-out workloads

    # Dotted keys the user gave (config file and --set, not the packaged defaults): only those
    # can earn a "does not apply" warning. None: not built by load_config; every set field counts.
    _given: frozenset[str] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _strategies_fit_backend(self):
        server = self.backend.kind in SERVER_KINDS
        wrong = [s for s in self.strategies if (s == "server") != server]
        if wrong:
            need = "[server]" if server else "naive, dynamic, continuous, priority, sjf, vtc or a policy's import path"
            raise ValueError(f"strategies: backend.kind '{self.backend.kind}' takes {need}, not {', '.join(wrong)}")
        if len(set(self.strategies)) < len(self.strategies):
            raise ValueError(f"strategies: each strategy may be listed once (got {', '.join(self.strategies)})")
        return self

    @model_validator(mode="after")
    def _workloads_are_traffic(self):
        for name, keys in self.validation.workloads.items():
            try:
                TrafficConfig.model_validate(self.traffic.model_dump() | keys)
            except ValidationError as e:
                raise ValueError(f"validation.workloads.{name}: traffic {format_error(e)}") from None
        return self

    def workload(self, name: str) -> "RunConfig":
        """This config with workload `name`'s traffic (`base`: as it is), and no validation section."""
        traffic = self.traffic if name == "base" else TrafficConfig.model_validate(
            self.traffic.model_dump() | self.validation.workloads[name])
        return self.model_copy(update={"traffic": traffic, "validation": ValidateConfig()})

    @model_validator(mode="after")
    def _sessions_need_a_driver(self):
        # NOTE: a session's next turn exists only once its previous answer finished, which the
        # driver sees (run/driver.py, run/replicas.py); a server backend sends a fixed trace by
        # itself, so it cannot close the loop (yet).
        if self.traffic.sessions is not None and self.backend.kind in SERVER_KINDS:
            raise ValueError(f"traffic.sessions: not supported with backend.kind '{self.backend.kind}' (it sends "
                             "a fixed trace itself); use backend.kind sim or hf")
        return self

    def batch_rows(self, strategy: str) -> int:
        """The most requests one batch (or step) of `strategy` holds: what a burst is sized by."""
        return {"naive": self.naive.batch_size, "dynamic": self.dynamic.max_batch_size}.get(
            strategy, self.continuous.max_num_seqs)

    def knobs(self, strategy: str) -> dict[str, Any]:
        """The settings that shape one strategy's run, flattened for CSV rows and reports."""
        if strategy == "server":
            knobs = {"backend.model": self.backend.model, "backend.base_url": self.backend.base_url}
            if self.backend.kind == "hf-cb":   # transformers' manager runs under our budgets
                knobs |= {f"continuous.{k}": v for k, v in quiet_section(self, "continuous").items()}
            return knobs
        if strategy in ("naive", "dynamic", "continuous"):
            return {f"{strategy}.{k}": v for k, v in quiet_section(self, strategy).items()}
        # policies run on the continuous machinery: its budgets, then their own knobs
        knobs = {f"continuous.{k}": v for k, v in quiet_section(self, "continuous").items()}
        if strategy in POLICIES:
            knobs |= {f"{strategy}.{k}": v for k, v in quiet_section(self, strategy).items()}
        return knobs

    def tree(self) -> dict[str, Any]:
        """The whole config as JSON-ready data (what identities and config.yaml record)."""
        # NOTE: `validation` says how to check a simulator, not what a run means: never in an identity
        tree = self.model_dump(mode="json", exclude={"executor", "validation"})
        for (section, key), default in QUIET_DEFAULTS.items():
            if tree[section].get(key) == default:
                del tree[section][key]
        for section in POLICIES:     # NOTE: sections added later: recorded once set, like QUIET_DEFAULTS
            if getattr(self, section) == type(getattr(self, section))():
                del tree[section]
        return tree


# NOTE: keys added after results directories existed are left out of knobs, identities and
# config.yaml while they hold their default, so an older directory keeps its digest (and resumes)
# and a default run writes the same bytes as before the key existed.
QUIET_DEFAULTS: dict[tuple[str, str], Any] = {("continuous", "prefix_caching"): False, ("backend", "compile"): False}


def quiet_section(cfg: RunConfig, name: str) -> dict[str, Any]:
    """A section's settings without the QUIET_DEFAULTS keys that hold their default (knobs, point hashes)."""
    return {k: v for k, v in getattr(cfg, name).model_dump().items()
            if QUIET_DEFAULTS.get((name, k), _NO_DEFAULT) != v}


_NO_DEFAULT = object()


def _leaves(tree: Any, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict) or not tree:
        return {prefix.rstrip(".")} if prefix else set()
    out = set()
    for k, v in tree.items():
        out |= _leaves(v, f"{prefix}{k}.")
    return out


def format_error(err: ValidationError) -> str:
    """A pydantic error as one line per problem, joined with '; ', naming each key."""
    lines = []
    for e in err.errors():
        loc = ".".join(_printable(p) for p in e["loc"] if not str(p).startswith(("function-", "tagged-")))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        got = e.get("input")
        quiet = (e["type"] in ("extra_forbidden", "missing") or isinstance(got, dict)
                 or any(str(p) in _SECRET_KEYS for p in e["loc"]))
        tail = "" if quiet else f" (got {_short(got)})"
        lines.append(f"{loc or 'config'}: {msg}{tail}")
    return one_line("; ".join(lines))


def _printable(part: Any) -> str:
    s = str(part)
    return s if s.isprintable() and len(s) <= 60 else _short(s)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_line(text: str) -> str:
    """Collapse line breaks (YAML and library messages have them): an error is one line."""
    return " ".join(text.split()) if ("\n" in text or "\r" in text) else text


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: what went wrong and where."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return one_line(f"{problem}{where}")


def _set_path(tree: dict, dotted: str, value: Any) -> None:
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
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError as e:
            # NOTE: one_line: the key itself may hold a line break (found by tests/core/test_fuzz_inputs.py)
            raise ConfigError(one_line(f"--set {key}: cannot parse {_short(raw)}: {_yaml_problem(e)}")) from None
        except RecursionError:
            raise ConfigError(f"--set {key}: value nested too deeply") from None
        out.append((key.strip(), value))
    return out


def _read_yaml(p: Path) -> dict:
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        loaded = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {_yaml_problem(e)}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return loaded


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> RunConfig:
    """Read YAML (or start from `base`/defaults), apply `--set` overrides, validate.
    Every mistake is a ConfigError with one line; `config_warnings(cfg)` lists ignored keys."""
    tree: dict = dict(base or {})
    given: set[str] = set()
    if path is not None:
        tree = _read_yaml(Path(path))
        given |= _leaves(tree)
    for key, value in parse_overrides(list(overrides)):
        _set_path(tree, key, value)
        given |= _leaves(value, key + ".") if isinstance(value, dict) and value else {key}
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as e:
        where = f"{path}: " if path else ""
        raise ConfigError(where + format_error(e)) from None
    except RecursionError:
        raise ConfigError(f"{path or '--set'}: nested too deeply") from None
    cfg._given = frozenset(given)
    return cfg


def default_config_text() -> str:
    """The packaged default sweep (batchlab/data/default.yaml; configs/sim.yaml is a copy)."""
    return resources.files("batchlab").joinpath("data/default.yaml").read_text()


def load_user_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """What a command line means: CONFIG if given, else the packaged default sweep, then --set.
    The one place the default config is read (run, serve, profile and the benchmarks call it)."""
    base = None if path is not None else yaml.safe_load(default_config_text())
    return load_config(path, list(overrides), base=base)
