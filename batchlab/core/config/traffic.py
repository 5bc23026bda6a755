"""The traffic section: when requests arrive and how long their prompts and outputs are.

Every number is finite and bounded (core/limits.py), and one sweep point may generate at most
MAX_REQUESTS_PER_POINT requests and MAX_TOKENS_PER_POINT tokens: a typo such as `rates=[1e9]` is
refused here instead of allocating until the machine runs out of memory.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from batchlab.core.config.base import GROWS, INPUT_FILE, Model, identity_role
from batchlab.core.limits import MAX_LENGTH, MAX_SECONDS, MAX_USERS, MIN_RATE, Rate, Seconds, Tokens, check_point_size


class LengthDist(Model):
    """A token-length distribution: a number (fixed), or `{dist: uniform, low, high}`,
    `{dist: lognormal, median, sigma, low, high}` (clipped to [low, high]), or
    `{dist: sharegpt, path}` (lengths of a ShareGPT-format JSON file, counting words as tokens)."""
    dist: Literal["fixed", "uniform", "lognormal", "sharegpt"] = "fixed"
    """How lengths are drawn."""
    value: Tokens | None = None
    """fixed: the length, tokens."""
    low: Tokens = 1
    """uniform, lognormal: the shortest length, tokens."""
    high: Tokens | None = None
    """uniform, lognormal: the longest length, tokens (lognormal unset: 2^20)."""
    median: Annotated[float, Field(gt=0, le=MAX_LENGTH)] | None = None
    """lognormal: the median length, tokens."""
    sigma: Annotated[float, Field(gt=0, le=10)] = 0.5
    """lognormal: the shape (standard deviation of the log)."""
    path: str | None = identity_role(INPUT_FILE)
    """sharegpt: the ShareGPT JSON file."""

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


def as_length(v: Any) -> Any:
    """A bare integer is a fixed length; a boolean is a mistake (YAML's `yes`)."""
    if isinstance(v, bool):
        raise ValueError("must be a positive integer or a mapping like {dist: uniform, low: 50, high: 300}")
    if isinstance(v, int):
        return {"dist": "fixed", "value": v}
    return v


class RateStep(Model):
    """Burst test: the arrival rate switches from the point's rate to `to_rate` at `at_s`,
    and back to the point's rate at `until_s` (unset: it stays at `to_rate`)."""
    at_s: Seconds
    """When the burst starts, seconds from the run's start."""
    to_rate: Rate
    """The burst's rate, req/s."""
    until_s: Seconds | None = None
    """When it ends, seconds from the run's start (unset: never)."""

    @model_validator(mode="after")
    def _check(self):
        if self.until_s is not None and self.until_s <= self.at_s:
            raise ValueError(f"until_s ({self.until_s}) must be after at_s ({self.at_s})")
        if self.to_rate < MIN_RATE:
            raise ValueError(f"to_rate must be at least {MIN_RATE:g} req/s (got {self.to_rate:g})")
        return self


class ReplayConfig(Model):
    """How a trace file is read and replayed (core/trace_formats.py). Times are the file's,
    relative to its earliest request; the window is cut first, then scaled."""
    format: Literal["auto", "batchlab", "azure", "burstgpt", "mooncake"] = "auto"
    """The file's format (auto: from its header or first line)."""
    start_s: Annotated[float, Field(ge=0, le=MAX_SECONDS * 1000)] = 0.0
    """Skip the file's first start_s seconds."""
    duration_s: Annotated[float, Field(gt=0, le=MAX_SECONDS * 1000)] | None = None
    """Then keep this many seconds (unset: all)."""
    time_scale: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """Multiply the gaps between arrivals: 0.5 replays twice as fast."""
    model: str | None = None
    """burstgpt: keep rows of this Model (e.g. ChatGPT, GPT-4)."""
    log_type: str | None = None
    """burstgpt: keep rows of this Log Type (e.g. "Conversation log")."""
    block_size: Tokens = 512
    """mooncake: prompt tokens per hash id (Mooncake's traces: 512)."""


class PrefixConfig(Model):
    """Shared system prompts: `groups` prompts of `tokens` tokens each; a request picks group g
    (0-based) with probability proportional to 1 / (g + 1)^zipf, then adds its own message of
    traffic.prompt_len tokens (at most 2^20 - tokens: a prompt stays within 2^20)."""
    groups: Annotated[int, Field(gt=0, le=1_000_000)] = 8
    """How many shared prompts."""
    tokens: Annotated[int, Field(gt=0, lt=MAX_LENGTH)] = 1024
    """Tokens of each group's shared prompt."""
    zipf: Annotated[float, Field(ge=0, le=10)] = 1.0
    """Popularity skew: 0 = every group equally likely."""


class SessionsConfig(Model):
    """Multi-turn conversations: a session starts at each arrival of the rate's process and
    sends `turns` requests; turn k+1 is sent think time after turn k's answer finished (a closed
    loop per session), its prompt being the whole conversation so far plus a new message."""
    turns: Annotated[int, Field(gt=0, le=1000)] = 4
    """Requests per session."""
    think_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 5.0
    """Mean seconds between an answer and the next turn."""
    think: Literal["exponential", "fixed"] = "exponential"
    """Think-time distribution."""
    message_len: LengthDist = LengthDist(dist="fixed", value=64)
    """Tokens of each later turn's new message."""

    _lengths = field_validator("message_len", mode="before")(as_length)


class SLOConfig(Model):
    """Latency thresholds a request must meet to count towards goodput (unset: no threshold)."""
    ttft_s: Seconds | None = None
    """Time to first token, seconds."""
    tpot_s: Seconds | None = None
    """Time per output token after the first, seconds."""
    e2e_s: Seconds | None = None
    """End-to-end latency, seconds."""


class TrafficClass(Model):
    """One class of traffic (traffic.classes): a share of the arrivals with its own lengths, who
    sends it (`tenant`), how urgent it is (`priority`, lower first, as vLLM's) and, optionally,
    its own SLO. `weight`: its share of each point's rate; `rate`: instead, its own Poisson
    stream of that many req/s whatever the point's rate (a fixed background load)."""
    name: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_.-]+$")]
    """The class's name (CSV column `class`)."""
    weight: Annotated[float, Field(gt=0, le=1e6)] | None = None
    """Its share of each point's rate (relative to the other classes' weights)."""
    rate: Rate | None = None
    """Instead of a weight: its own Poisson stream, req/s."""
    prompt_len: LengthDist | None = None
    """Its prompt lengths (unset: traffic.prompt_len)."""
    output_len: LengthDist | None = None
    """Its output lengths (unset: traffic.output_len)."""
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    """Lower runs first under the priority policy."""
    tenant: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_.-]+$")] | None = None
    """Who sends it (unset: the class's name)."""
    slo: SLOConfig | None = None
    """Its own SLO (unset: the run's)."""

    _lengths = field_validator("prompt_len", "output_len", mode="before")(as_length)

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


class TrafficConfig(Model):
    """The requests of each sweep point: seeded arrivals at each rate, or a replayed trace file."""
    arrival: Literal["poisson", "gamma", "constant", "trace", "closed"] = "poisson"
    """The arrival process (trace: replay traffic.trace_file; closed: traffic.concurrency users, each
    sending its next request the moment its previous answer ends)."""
    burstiness: Annotated[float, Field(ge=0.01, le=1000)] = 1.0
    """gamma: the shape of the gaps (1 = Poisson, < 1 burstier)."""
    trace_file: str | None = identity_role(INPUT_FILE)
    """trace: the file replayed (batchlab CSV, Azure, BurstGPT or Mooncake)."""
    rates: list[Rate] = identity_role(GROWS, default_factory=lambda: [5.0, 20.0, 50.0], min_length=1, max_length=1000)
    """Arrival rates, req/s: one sweep point each (with traffic.sessions: sessions started per second)."""
    concurrency: list[Annotated[int, Field(gt=0, le=MAX_USERS)]] | None = identity_role(
        GROWS, default=None, min_length=1, max_length=1000)
    """closed: users, one sweep point per level (e.g. [1, 4, 16, 64]); all start at once, and each
    sends its next request when its previous answer's last token arrives, until the point's end."""
    duration_s: Seconds = 60.0
    """Seconds of traffic per point, after the warm-up."""
    warmup_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 5.0
    """Arrivals in the first warmup_s seconds are left out of the metrics."""
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    """The trace depends on (seed, rate, repeat) only: every strategy sees the same requests."""
    repeats: Annotated[int, Field(gt=0, le=1000)] = identity_role(GROWS, 1)
    """Traces per rate, each of its own seed."""
    prompt_len: LengthDist = LengthDist(dist="fixed", value=128)
    """Prompt tokens per request."""
    output_len: LengthDist = LengthDist(dist="fixed", value=128)
    """Output tokens per request (exact: end-of-sequence is ignored)."""
    rate_step: RateStep | None = None
    """A burst inside each point."""
    replay: ReplayConfig | None = None
    """trace: how the file is read (format, window, time scale, filters)."""
    prefix: PrefixConfig | None = None
    """Shared system prompts before each request's message."""
    sessions: SessionsConfig | None = None
    """Multi-turn conversations (a closed loop per session)."""
    classes: list[TrafficClass] | None = Field(default=None, min_length=1, max_length=64)
    """A mix of classes: tenants, priorities, lengths, SLOs."""

    _lengths = field_validator("prompt_len", "output_len", mode="before")(as_length)

    @model_validator(mode="after")
    def _check(self):
        if self.arrival == "trace" and not self.trace_file:
            raise ValueError("arrival 'trace' needs traffic.trace_file")
        if self.arrival == "closed":
            return _check_closed(self)
        if self.classes is not None:
            _check_classes(self)
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
    def load_unit(self) -> str:
        """What a sweep point's `rate` counts: users (closed loop), sessions started per second
        (traffic.sessions) or requests per second."""
        return "users" if self.arrival == "closed" else "sessions/s" if self.sessions else "req/s"

    @property
    def levels(self) -> list[float]:
        """The sweep's load levels, lowest first: its rates, or its user counts (closed loop)."""
        return sorted({float(x) for x in (self.concurrency if self.arrival == "closed" else self.rates)})

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


def _check_closed(t: TrafficConfig) -> TrafficConfig:
    """A closed loop has no rate: its points are user counts, and how many requests each sends
    is known only at run time (core/closed_loop.py caps a point at MAX_REQUESTS_PER_POINT)."""
    if not t.concurrency:
        raise ValueError("arrival 'closed' needs traffic.concurrency, the users of each point (e.g. [1, 4, 16, 64])")
    for i, users in enumerate(t.concurrency):
        if users in t.concurrency[:i]:
            raise ValueError(f"concurrency.{i}: {users} users is listed twice")
    for key in ("rate_step", "prefix", "sessions", "classes"):
        if getattr(t, key) is not None:
            raise ValueError(f"{key} cannot be combined with arrival 'closed' (yet): a closed loop's users "
                             "send independent requests of traffic.prompt_len and traffic.output_len")
    return t


def _check_classes(t: TrafficConfig) -> None:
    names = [c.name for c in t.classes]
    if len(set(names)) < len(names):
        raise ValueError(f"classes: each class name may be used once (got {', '.join(names)})")
    if t.sessions is not None:
        raise ValueError("classes cannot be combined with sessions (yet): a session's turns would need a class each")
    if all(c.weight is None for c in t.classes):
        raise ValueError("classes: at least one class needs a weight (a share of the point's rate, which the sweep varies)")
