"""Seeded request traces: when requests arrive and how long their prompts and outputs are.

A trace depends only on (config, rate, repeat), never on the strategy, so every strategy sees
exactly the same requests. Arrival times are planned offsets from the run's start; the driver
stamps the planned time, not the moment it noticed the request.
Gamma inter-arrival gaps with shape k keep the mean at 1/rate and have coefficient of
variation 1/sqrt(k): k = 1 is Poisson, k < 1 is burstier, k -> inf approaches constant rate.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from batchlab.core.closed_loop import first_requests
from batchlab.core.config import LengthDist, TrafficConfig, one_line
from batchlab.core.content import token_ids
from batchlab.core.limits import MAX_LENGTH, MAX_REQUESTS_PER_POINT, check_point_size
from batchlab.core.request import Request
from batchlab.core.sessions import plan_followups
from batchlab.core.trace_formats import read_trace, read_trace_file  # noqa: F401  (read_trace_file: the old home)
from batchlab.core.trace_item import TraceItem
from batchlab.errors import ConfigError


def build_trace(cfg: TrafficConfig, rate: float, repeat: int = 0) -> list[TraceItem]:
    """The trace for one sweep point. Same arguments, same trace, on any machine."""
    if cfg.arrival == "trace":
        return read_trace(cfg).items
    if cfg.arrival == "closed":                # the point's `rate` is its number of users
        return first_requests(cfg, int(rate), repeat)
    seed = np.random.SeedSequence([cfg.seed, repeat])
    arr_rng, len_rng = (np.random.default_rng(s) for s in seed.spawn(2))
    times = arrival_times(cfg, rate, arr_rng)
    if cfg.classes:
        trace = _classed(cfg, times, (cfg.seed, repeat))
    else:
        prompts, p_text = sample_lengths(cfg.prompt_len, len(times), len_rng, "human")
        outputs, _ = sample_lengths(cfg.output_len, len(times), len_rng, "gpt")
        trace = [TraceItem(float(t), int(p), int(o), p_text[i] if p_text else "")
                 for i, (t, p, o) in enumerate(zip(times, prompts, outputs))]
    if cfg.prefix is None and cfg.sessions is None:
        return trace
    # NOTE: a third stream, spawned after the first two, which stay as they were: plain traffic
    # with the same seed keeps its arrivals and lengths when prefix or sessions are added.
    return _shared_content(cfg, trace, np.random.default_rng(seed.spawn(1)[0]), (cfg.seed, repeat))


def _classed(cfg: TrafficConfig, times: np.ndarray, key: tuple[int, int]) -> list[TraceItem]:
    """traffic.classes: each arrival of the point's process joins a weighted class; a class with
    its own `rate` adds its own Poisson stream. Every class draws its lengths from its own seeded
    stream, so adding a class leaves the others' requests as they were."""
    classes = cfg.classes
    shared = [i for i, c in enumerate(classes) if c.weight is not None]
    w = np.array([classes[i].weight for i in shared], dtype=np.float64)
    pick = np.random.default_rng([*key, 0xC1A55]).choice(len(shared), size=len(times), p=w / w.sum())
    members: dict[int, list[float]] = {i: times[pick == j].tolist() for j, i in enumerate(shared)}
    for i, c in enumerate(classes):
        if c.rate is not None:
            own = cfg.model_copy(update={"arrival": "poisson", "rate_step": None})
            members[i] = arrival_times(own, c.rate, np.random.default_rng([*key, 0xA221, i])).tolist()
    items = []
    for i, c in enumerate(classes):
        at = members[i]
        rng = np.random.default_rng([*key, 0x1E46, i])
        prompts, p_text = sample_lengths(c.prompt_len or cfg.prompt_len, len(at), rng, "human")
        outputs, _ = sample_lengths(c.output_len or cfg.output_len, len(at), rng, "gpt")
        items += [TraceItem(float(t), int(p), int(o), p_text[j] if p_text else "",
                            klass=c.name, tenant=c.who, priority=c.priority)
                  for j, (t, p, o) in enumerate(zip(at, prompts, outputs))]
    # NOTE: a stable sort: equal arrival times keep the classes' listed order
    return sorted(items, key=lambda it: it.arrival)


def _shared_content(cfg: TrafficConfig, trace: list[TraceItem], rng: np.random.Generator,
                    key: tuple) -> list[TraceItem]:
    """Give each request its prompt's content: a group's system prompt (traffic.prefix) and its own
    message; with traffic.sessions also the plan of its conversation's later turns."""
    n = len(trace)
    groups = zipf_groups(cfg.prefix.groups, cfg.prefix.zipf, n, rng) if cfg.prefix else [None] * n
    k = cfg.sessions.turns - 1 if cfg.sessions else 0
    later = (plan_followups(cfg.sessions, n, rng, sample_lengths(cfg.output_len, n * k, rng, "gpt")[0], key)
             if cfg.sessions else [None] * n)
    out = []
    for i, (item, g, plan) in enumerate(zip(trace, groups, later)):
        system = () if g is None else ((("prefix", key[0], g), cfg.prefix.tokens),)
        room = MAX_LENGTH - (cfg.prefix.tokens if g is not None else 0)
        content = (("message", *key, i, 1), min(item.prompt_len, room))
        out.append(replace(item, prompt_len=sum(n for _, n in (*system, content)), prompt="",
                           content=(*system, content), prefix_group=g, session=plan))
    return out


def zipf_groups(groups: int, s: float, n: int, rng: np.random.Generator) -> list[int]:
    """n group numbers in 0..groups-1, group g drawn with probability proportional to 1/(g+1)^s."""
    weights = 1.0 / np.arange(1, groups + 1, dtype=np.float64) ** s
    return rng.choice(groups, size=n, p=weights / weights.sum()).tolist()


def arrival_times(cfg: TrafficConfig, rate: float, rng: np.random.Generator) -> np.ndarray:
    horizon = cfg.warmup_s + cfg.duration_s
    step = cfg.rate_step
    times: list[float] = []
    t = 0.0
    while True:
        in_step = step is not None and step.at_s <= t < (step.until_s or np.inf)
        lam = step.to_rate if in_step else rate
        t += _gap(cfg, lam, rng)
        if t >= horizon:
            return np.asarray(times)
        times.append(t)
        if len(times) > 2 * MAX_REQUESTS_PER_POINT:     # NOTE: a backstop; the config caps the mean at half this
            raise ConfigError(f"traffic: more than {2 * MAX_REQUESTS_PER_POINT:,} arrivals in one point")


def _gap(cfg: TrafficConfig, lam: float, rng: np.random.Generator) -> float:
    if cfg.arrival == "poisson":
        return rng.exponential(1.0 / lam)
    if cfg.arrival == "gamma":
        k = cfg.burstiness
        return rng.gamma(k, 1.0 / (lam * k))
    return 1.0 / lam  # constant


def sample_lengths(d: LengthDist, n: int, rng: np.random.Generator, role: str) -> tuple[np.ndarray, list[str]]:
    """n lengths from `d`; for ShareGPT also the texts they came from."""
    if d.dist == "fixed":
        return np.full(n, d.value), []
    if d.dist == "uniform":
        return rng.integers(d.low, d.high + 1, size=n), []
    if d.dist == "lognormal":
        x = np.rint(d.median * np.exp(d.sigma * rng.standard_normal(n)))
        return np.clip(x, d.low, d.high or MAX_LENGTH).astype(int), []
    turns = _sharegpt_turns(d.path, role)
    idx = rng.integers(0, len(turns), size=n)
    lens = np.array([len(turns[i].split()) for i in idx], dtype=int)
    return np.clip(lens, d.low, d.high or MAX_LENGTH), [turns[i] for i in idx]


def check_inputs(cfg: TrafficConfig) -> list[str]:
    """Read every file the traffic config names, before anything is written: a bad trace or
    ShareGPT file fails here naming the file (and row), and the per-point caps are applied again
    with real lengths (a ShareGPT length's mean is known only once its file is read).
    Returns warning lines (a replayed trace's skipped or reordered rows)."""
    if cfg.arrival == "trace":
        return read_trace(cfg).warnings        # checks every row and the caps itself
    if cfg.arrival == "closed":                # no rate to size a point by: ClosedLoop caps it as it runs
        for d, role in ((cfg.prompt_len, "human"), (cfg.output_len, "gpt")):
            _mean_length(d, role)              # a ShareGPT file is read (and refused) now
        return []
    tokens = sum(_mean_length(d, role) for d, role in ((cfg.prompt_len, "human"), (cfg.output_len, "gpt")))
    if cfg.sessions is not None and cfg.sessions.message_len.dist == "sharegpt":
        tokens += (cfg.sessions.turns - 1) / 2 * _mean_length(cfg.sessions.message_len, "human")
    for c in cfg.classes or ():                # a class's own ShareGPT files are read here too
        tokens = max(tokens, sum(_mean_length(d, role) for d, role in ((c.prompt_len, "human"), (c.output_len, "gpt"))
                                 if d is not None))
    tokens = max(tokens, cfg.mean_tokens())    # prefix and sessions counted there
    for rate in cfg.rates:
        n = cfg.expected_requests(rate)
        try:
            check_point_size(n, n * tokens, rate)
        except ValueError as e:
            raise ConfigError(f"traffic: {e}") from None
    return []


def _mean_length(d: LengthDist, role: str) -> float:
    if d.dist != "sharegpt":
        return d.mean()
    words = np.array([len(t.split()) for t in _sharegpt_turns(d.path, role)])
    return float(np.clip(words, d.low, d.high or MAX_LENGTH).mean())


SHAREGPT_SHAPE = '[{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}]'


@lru_cache(maxsize=4)
def _sharegpt_turns(path: str, role: str) -> tuple[str, ...]:
    """First turn of `role` ('human' or 'gpt') in each conversation of a ShareGPT JSON file.
    Conversations without such a turn are skipped; a file of another shape is refused."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"traffic: ShareGPT file not found: {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"{p}: not valid JSON: {one_line(str(e))}") from None
    if not isinstance(data, list):
        raise ConfigError(f"{p}: expected a JSON list of conversations (ShareGPT format: {SHAREGPT_SHAPE}), "
                          f"got a {type(data).__name__}")
    turns = []
    for i, conv in enumerate(data):
        chat = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(chat, list):
            raise ConfigError(f"{p}: conversation {i}: expected an object with a \"conversations\" list "
                              f"(ShareGPT format: {SHAREGPT_SHAPE})")
        for j, turn in enumerate(chat):
            if not isinstance(turn, dict):
                raise ConfigError(f"{p}: conversation {i}, turn {j}: expected an object like "
                                  '{"from": "human", "value": "..."}')
            if turn.get("from") == role and str(turn.get("value", "")).strip():
                turns.append(str(turn["value"]))
                break
    if not turns:
        raise ConfigError(f"{p}: no '{role}' turns found (expected ShareGPT format: {SHAREGPT_SHAPE})")
    return tuple(turns)


def trace_rate(items: list[TraceItem]) -> float:
    """Mean arrival rate of a replayed trace, used as its sweep point's `rate`."""
    span = items[-1].arrival if len(items) > 1 else 1.0
    return len(items) / span if span > 0 else float(len(items))


def make_requests(trace: list[TraceItem], t0: float, prepare: Callable[[Request], None] | None = None,
                  vocab: int | None = None, indices: list[int] | None = None) -> list[Request]:
    """One request per trace item, arriving at t0 + its offset, each passed to `prepare` (the
    backend's). A request `prepare` refuses (ValueError: empty prompt, longer than the model's
    context) is recorded as failed with the reason, as a server would answer it with a 400: it
    stays in the results and never runs. An item with shared content gets its token ids here,
    within the backend's vocabulary `vocab` (core/content.py), on every backend alike.
    `indices`: each item's index in the whole trace, where `trace` is one load generator's share."""
    reqs = []
    for i, item in zip(indices if indices is not None else range(len(trace)), trace):
        r = Request(f"r{i:06d}", item.prompt_len, item.output_len, t0 + item.arrival, prompt=item.prompt, index=i)
        if item.user is not None:              # closed loop: named and numbered as the user's later ones
            r.request_id, r.session_id = f"u{item.user.number:05d}-{0:06d}", item.user.number
        if item.klass is not None:
            r.klass, r.tenant, r.priority = item.klass, item.tenant, item.priority
        if item.content:
            r.prompt_token_ids = token_ids(item.content, vocab)
            r.prefix_group = item.prefix_group
            if item.session is not None:
                r.session_id, r.turn = i, 1
        r.prepared(prepare)
        reqs.append(r)
    return reqs


def fixed_burst(n: int, prompt_len: int, output_len: int) -> list[TraceItem]:
    """n requests of exactly these lengths, all arriving at once (a saturated burst)."""
    return [TraceItem(0.0, prompt_len, output_len) for _ in range(n)]


def burst_trace(cfg: TrafficConfig, n: int) -> tuple[float, list[TraceItem]]:
    """The first `n` requests of the traffic's own trace (lengths, classes), all arriving at once:
    a queue that never empties, for measuring what a backend completes saturated. Also the rate
    they were drawn at (enough arrivals to take n of them), which labels the point."""
    rate = 1.5 * n / cfg.horizon_s
    return rate, [replace(t, arrival=0.0) for t in build_trace(cfg, rate, 0)[:n]]
