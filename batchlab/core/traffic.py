"""Seeded request traces: when requests arrive and how long their prompts and outputs are.

A trace depends only on (config, rate, repeat), never on the strategy, so every strategy sees
exactly the same requests. Arrival times are planned offsets from the run's start; the driver
stamps the planned time, not the moment it noticed the request.
Gamma inter-arrival gaps with shape k keep the mean at 1/rate and have coefficient of
variation 1/sqrt(k): k = 1 is Poisson, k < 1 is burstier, k -> inf approaches constant rate.
"""
from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from batchlab.core.config import LengthDist, TrafficConfig, one_line
from batchlab.core.limits import MAX_LENGTH, MAX_REQUESTS_PER_POINT, MAX_SECONDS, MAX_TOKENS_PER_POINT, check_point_size
from batchlab.core.request import Request
from batchlab.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TraceItem:
    arrival: float          # seconds after the run's start
    prompt_len: int         # tokens
    output_len: int         # tokens to generate
    prompt: str = ""        # text, when the source has it (ShareGPT, trace file)


def build_trace(cfg: TrafficConfig, rate: float, repeat: int = 0) -> list[TraceItem]:
    """The trace for one sweep point. Same arguments, same trace, on any machine."""
    if cfg.arrival == "trace":
        return read_trace_file(cfg.trace_file)
    seed = np.random.SeedSequence([cfg.seed, repeat])
    arr_rng, len_rng = (np.random.default_rng(s) for s in seed.spawn(2))
    times = arrival_times(cfg, rate, arr_rng)
    prompts, p_text = sample_lengths(cfg.prompt_len, len(times), len_rng, "human")
    outputs, _ = sample_lengths(cfg.output_len, len(times), len_rng, "gpt")
    return [TraceItem(float(t), int(p), int(o), p_text[i] if p_text else "")
            for i, (t, p, o) in enumerate(zip(times, prompts, outputs))]


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


def check_inputs(cfg: TrafficConfig) -> None:
    """Read every file the traffic config names, before anything is written: a bad trace or
    ShareGPT file fails here naming the file (and row), and the per-point caps are applied again
    with real lengths (a ShareGPT length's mean is known only once its file is read)."""
    if cfg.arrival == "trace":
        read_trace_file(cfg.trace_file)        # checks every row and the caps itself
        return
    tokens = sum(_mean_length(d, role) for d, role in ((cfg.prompt_len, "human"), (cfg.output_len, "gpt")))
    for rate in cfg.rates:
        n = cfg.expected_requests(rate)
        try:
            check_point_size(n, n * tokens, rate)
        except ValueError as e:
            raise ConfigError(f"traffic: {e}") from None


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


TRACE_COLUMNS = ("arrival_time", "prompt_len", "output_len")
TRACE_HEADER = ",".join(TRACE_COLUMNS)


def read_trace_file(path: str) -> list[TraceItem]:
    """CSV with columns arrival_time (s), prompt_len, output_len, and optionally prompt.
    Every row is checked; a bad one fails with the file and line number. The per-point caps
    (MAX_REQUESTS_PER_POINT rows, MAX_TOKENS_PER_POINT tokens) apply to a trace too."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"traffic.trace_file not found: {p}")
    items: list[TraceItem] = []
    # NOTE: utf-8-sig: spreadsheet programs start CSV files with a byte-order mark.
    with p.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        try:
            _check_header(p, reader)
            for row in reader:
                items.append(_trace_item(row, f"{p}:{reader.line_num}"))
                if len(items) > MAX_REQUESTS_PER_POINT:
                    raise ConfigError(f"{p}: more than {MAX_REQUESTS_PER_POINT:,} rows; a point may have at most "
                                      f"{MAX_REQUESTS_PER_POINT:,} requests")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
        except csv.Error as e:
            raise ConfigError(f"{p}:{reader.line_num}: {one_line(str(e))}") from None
    if not items:
        raise ConfigError(f"{p}: no rows after the header (expected one row per request: {TRACE_HEADER})")
    tokens = sum(i.prompt_len + i.output_len for i in items)
    if tokens > MAX_TOKENS_PER_POINT:
        raise ConfigError(f"{p}: {tokens:,} prompt + output tokens; a point may have at most {MAX_TOKENS_PER_POINT:,}")
    return sorted(items, key=lambda i: i.arrival)


def _check_header(p: Path, reader: csv.DictReader) -> None:
    if reader.fieldnames is None:
        raise ConfigError(f"{p}: the file is empty (expected a header line {TRACE_HEADER}, then one row per request)")
    reader.fieldnames = [name.strip() for name in reader.fieldnames]
    missing = [c for c in TRACE_COLUMNS if c not in reader.fieldnames]
    if missing:
        raise ConfigError(f"{p}: missing column(s) {', '.join(missing)} (the first line must be the header "
                          f"{TRACE_HEADER}[,prompt])")


def _trace_item(row: dict, where: str) -> TraceItem:
    """One checked row. csv.DictReader puts surplus cells under the key None and fills
    missing ones with None."""
    if None in row:
        raise ConfigError(f"{where}: more cells than the header has (quote a prompt that contains commas)")
    empty = [c for c in TRACE_COLUMNS if row.get(c) is None or not row[c].strip()]
    if empty:
        raise ConfigError(f"{where}: missing {', '.join(empty)}")
    text = row["arrival_time"].strip()
    try:
        arrival = float(text)
    except ValueError:
        arrival = math.nan
    if not (0 <= arrival <= MAX_SECONDS):
        raise ConfigError(f"{where}: arrival_time must be a number of seconds from 0 to {MAX_SECONDS:g} (got {text!r})")
    prompt_len, output_len = (_trace_length(row[c], c, where) for c in ("prompt_len", "output_len"))
    return TraceItem(arrival, prompt_len, output_len, row.get("prompt") or "")


def _trace_length(cell: str, column: str, where: str) -> int:
    text = cell.strip()
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not (0 < n <= MAX_LENGTH):
        raise ConfigError(f"{where}: {column} must be a whole number of tokens from 1 to {MAX_LENGTH} (got {text!r})")
    return n


def trace_rate(items: list[TraceItem]) -> float:
    """Mean arrival rate of a replayed trace, used as its sweep point's `rate`."""
    span = items[-1].arrival if len(items) > 1 else 1.0
    return len(items) / span if span > 0 else float(len(items))


def make_requests(trace: list[TraceItem], t0: float, prepare: Callable[[Request], None] | None = None) -> list[Request]:
    """One request per trace item, arriving at t0 + its offset, each passed to `prepare` (the
    backend's). A request `prepare` refuses (ValueError: empty prompt, longer than the model's
    context) is recorded as failed with the reason, as a server would answer it with a 400: it
    stays in the results and never runs."""
    reqs = []
    for i, item in enumerate(trace):
        r = Request(f"r{i:06d}", item.prompt_len, item.output_len, t0 + item.arrival, prompt=item.prompt, index=i)
        if prepare is not None:
            try:
                prepare(r)
            except ValueError as e:
                r.fail(f"invalid request: {e}")
        reqs.append(r)
    return reqs
