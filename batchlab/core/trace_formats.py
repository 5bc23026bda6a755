"""Trace files, replayed as is: batchlab's own CSV and three published production formats.

| format   | file                                                                  | arrival            |
|----------|-----------------------------------------------------------------------|--------------------|
| batchlab | CSV `arrival_time, prompt_len, output_len[, prompt]`                  | seconds            |
| azure    | CSV `TIMESTAMP, ContextTokens, GeneratedTokens` (Azure LLM inference) | date and time      |
| burstgpt | CSV `Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type` | seconds  |
| mooncake | JSON lines `{"timestamp": ms, "input_length", "output_length", "hash_ids"}`     | milliseconds |

Every row is checked; a bad one fails naming the file and line. Arrivals count from the file's
earliest request; then the window (`replay.start_s`, `replay.duration_s`) is cut and the gaps are
scaled by `replay.time_scale`. Decisions, each reported as a warning line:
- rows out of time order are replayed sorted by time (published traces are sorted; a merged or
  hand-edited file need not be, and its order carries no meaning a replay could keep);
- rows of a production trace with a zero prompt or output are skipped (BurstGPT logs failed
  requests with 0 response tokens); batchlab's own CSV refuses them, as it always did.
A Mooncake row's `hash_ids` name its prompt's blocks of `replay.block_size` tokens (the last may
be partial): equal ids get equal token ids (core/content.py), which is what a prefix cache sees.
"""
from __future__ import annotations

import calendar
import csv
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from batchlab.core.config import ReplayConfig, TrafficConfig, one_line
from batchlab.core.content import Segment
from batchlab.core.limits import MAX_LENGTH, MAX_REQUESTS_PER_POINT, MAX_SECONDS, MAX_TOKENS_PER_POINT, MAX_TRACE_ROWS
from batchlab.core.trace_item import TraceItem
from batchlab.errors import ConfigError

FORMATS = ("batchlab", "azure", "burstgpt", "mooncake")
COLUMNS = {"batchlab": ("arrival_time", "prompt_len", "output_len"),
           "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
           "burstgpt": ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")}


@dataclass
class Replay:
    """A trace file's requests, in arrival order, and what replaying it decided (warning lines)."""
    items: list[TraceItem]
    warnings: list[str] = field(default_factory=list)


def read_trace(t: TrafficConfig) -> Replay:
    """The trace `traffic.trace_file` holds, in `traffic.replay`'s format, window and time scale."""
    r = t.replay or ReplayConfig()
    p = Path(t.trace_file)
    if not p.is_file():
        raise ConfigError(f"traffic.trace_file not found: {p}")
    # NOTE: a sweep reads its trace once per point and in preflight; a million-row file takes
    # seconds, so the last reading is kept while the file (size, mtime) and settings are the same.
    st = p.stat()
    got = _read_cached(p, st.st_size, st.st_mtime_ns, r, t.seed)
    return Replay(list(got.items), list(got.warnings))


@lru_cache(maxsize=2)
def _read_cached(p: Path, size: int, mtime_ns: int, r: ReplayConfig, seed: int) -> Replay:
    fmt = r.format if r.format != "auto" else detect_format(p)
    if fmt == "batchlab":
        items = read_trace_file(str(p))
        rows = _Rows(fmt, absolute=True)
        for i in items:
            rows.add(i.arrival, i.prompt_len, i.output_len, i.prompt)
    else:
        rows = READERS[fmt](p, r, seed)
    return rows.replay(p, r)


def detect_format(p: Path) -> str:
    """The format a file's first line names: a JSON object is Mooncake, else the CSV header."""
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:
            first = f.readline(65_536)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    if not first.strip():
        raise ConfigError(f"{p}: the file is empty (expected a trace: see traffic.replay.format)")
    if first.lstrip().startswith("{"):
        return "mooncake"
    names = {c.strip() for c in next(csv.reader([first]), [])}
    for fmt, need in COLUMNS.items():
        if set(need) <= names:
            return fmt
    raise ConfigError(f"{p}: cannot tell the trace format from its first line {_show(first)}; expected a header "
                      f"{','.join(COLUMNS['batchlab'])} (batchlab), {','.join(COLUMNS['azure'])} (azure), "
                      "Timestamp,Model,Request tokens,... (burstgpt) or JSON lines (mooncake), or set "
                      "traffic.replay.format")


@dataclass
class _Rows:
    """Rows as read: times in the file's unit (`per_s` to a second), lengths, content."""
    fmt: str
    per_s: float = 1.0
    absolute: bool = False              # times are offsets already (batchlab's CSV): keep them as they are
    times: list = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    content: list[tuple[Segment, ...]] = field(default_factory=list)
    skipped: int = 0                    # zero-length prompt or output
    read: int = 0

    def add(self, time, prompt: int, output: int, prompt_text: str = "", content: tuple = ()) -> None:
        self.times.append(time)
        self.prompts.append(prompt)
        self.outputs.append(output)
        self.texts.append(prompt_text)
        self.content.append(content)

    def count(self, p: Path, line: int) -> None:
        self.read += 1
        if self.read > MAX_TRACE_ROWS:
            raise ConfigError(f"{p}:{line}: more than {MAX_TRACE_ROWS:,} rows; cut the file (a point may replay at "
                              f"most {MAX_REQUESTS_PER_POINT:,} requests: traffic.replay.start_s / duration_s)")

    def replay(self, p: Path, r: ReplayConfig) -> Replay:
        if not self.times:
            why = f" ({self.skipped:,} skipped: zero-length prompt or output)" if self.skipped else ""
            raise ConfigError(f"{p}: no requests{why}")
        # NOTE: integer ticks (Azure's 100 ns, Mooncake's ms) are subtracted before the float
        # conversion: epoch seconds as a float keep only ~0.2 us.
        t = np.asarray(self.times)
        order = np.argsort(t, kind="stable")
        late = int(np.count_nonzero(np.diff(t) < 0))
        offsets = (t if self.absolute else t - t.min()).astype(np.float64) / self.per_s   # 2518 / 1000 is 2.518 exactly
        end = r.start_s + r.duration_s if r.duration_s is not None else math.inf
        keep = [i for i in order.tolist() if r.start_s <= offsets[i] < end]
        if not keep:
            raise ConfigError(f"{p}: no requests in the window start_s={r.start_s:g}, duration_s={r.duration_s} "
                              f"(the file spans {offsets.max():.6g} s)")
        if len(keep) > MAX_REQUESTS_PER_POINT:
            raise ConfigError(f"{p}: {len(keep):,} requests in the window; a point may have at most "
                              f"{MAX_REQUESTS_PER_POINT:,}: narrow traffic.replay.duration_s")
        span = (offsets[keep[-1]] - r.start_s) * r.time_scale
        if span > MAX_SECONDS:
            raise ConfigError(f"{p}: the replay spans {span:,.0f} s, over the limit of {MAX_SECONDS:,.0f} s (a week): "
                              "set traffic.replay.duration_s or time_scale")
        tokens = sum(self.prompts[i] + self.outputs[i] for i in keep)
        if tokens > MAX_TOKENS_PER_POINT:
            raise ConfigError(f"{p}: {tokens:,} prompt + output tokens; a point may have at most "
                              f"{MAX_TOKENS_PER_POINT:,}: narrow traffic.replay.duration_s")
        items = [TraceItem(float((offsets[i] - r.start_s) * r.time_scale), self.prompts[i], self.outputs[i],
                           self.texts[i], self.content[i]) for i in keep]
        return Replay(items, self._warnings(p, late))

    def _warnings(self, p: Path, late: int) -> list[str]:
        out = []
        if self.skipped:
            out.append(f"{p}: skipped {self.skipped:,} of {self.read:,} rows with a zero-length prompt or output")
        if late:
            out.append(f"{p}: {late:,} rows are earlier than the row before them; replayed in time order")
        return out


def _show(text: str, limit: int = 60) -> str:
    text = repr(text.rstrip("\r\n"))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _length(text, column: str, where: str) -> int:
    """A token count from a cell: a whole number from 0 to MAX_LENGTH (0: the row is skipped)."""
    if isinstance(text, bool):
        n = -1
    elif isinstance(text, int):
        n = text
    else:
        s = str(text).strip()
        try:
            n = int(s)
        except ValueError:
            try:                         # "12.0": some exports write counts as floats
                x = float(s)
                n = int(x) if x.is_integer() else -1
            except (ValueError, OverflowError):
                n = -1
    if not (0 <= n <= MAX_LENGTH):
        raise ConfigError(f"{where}: {column} must be a whole number of tokens from 0 to {MAX_LENGTH} (got {_show(str(text))})")
    return n


def _seconds(text, column: str, where: str, scale: float = 1.0) -> float:
    try:
        x = float(text) if not isinstance(text, bool) else math.nan
    except (ValueError, TypeError):
        x = math.nan
    if not (0 <= x * scale <= 1e12):        # about 31,700 years: any epoch time, no inf or nan
        raise ConfigError(f"{where}: {column} must be a non-negative number (got {_show(str(text))})")
    return x


_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?")


def azure_ticks(text: str, where: str) -> int:
    """A TIMESTAMP cell in 100 ns ticks since 1970 (UTC; an offset, if given, is applied):
    '2023-11-16 18:15:46.6805900' (7-digit fractions, as Azure writes them), ISO 8601 with T or
    Z, or a plain number of seconds."""
    s = text.strip()
    m = _DATETIME.fullmatch(s)
    if m is None:
        return round(_seconds(s, "TIMESTAMP", where) * 10**7)
    y, mo, d, h, mi, sec = (int(g) for g in m.groups()[:6])
    try:
        datetime(y, mo, d, h, mi, sec)
    except ValueError:
        raise ConfigError(f"{where}: TIMESTAMP is not a valid date and time (got {_show(text)})") from None
    ticks = calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) * 10**7 + int((m[7] or "").ljust(7, "0")[:7])
    if m[8] and m[8] != "Z":
        sign = -1 if m[8][0] == "-" else 1
        hh, mm = int(m[8][1:3]), int(m[8][-2:])
        ticks -= sign * (hh * 3600 + mm * 60) * 10**7
    return ticks


def _csv_rows(p: Path, fmt: str):
    """(line number, row) of a CSV file with `fmt`'s columns; one-line errors for the rest."""
    with p.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        try:
            if reader.fieldnames is None:
                raise ConfigError(f"{p}: the file is empty (expected the header {','.join(COLUMNS[fmt])})")
            reader.fieldnames = [name.strip() for name in reader.fieldnames]
            missing = [c for c in COLUMNS[fmt] if c not in reader.fieldnames]
            if missing:
                raise ConfigError(f"{p}: missing column(s) {', '.join(missing)} for format '{fmt}' "
                                  f"(expected a header {','.join(COLUMNS[fmt])})")
            for row in reader:
                where = f"{p}:{reader.line_num}"
                empty = [c for c in COLUMNS[fmt] if row.get(c) is None or not str(row[c]).strip()]
                if empty:
                    raise ConfigError(f"{where}: missing {', '.join(empty)}")
                yield reader.line_num, where, row
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
        except csv.Error as e:
            raise ConfigError(f"{p}:{reader.line_num}: {one_line(str(e))}") from None


def read_azure(p: Path, r: ReplayConfig, seed: int) -> _Rows:
    rows = _Rows("azure", per_s=1e7)
    for line, where, row in _csv_rows(p, "azure"):
        rows.count(p, line)
        t = azure_ticks(row["TIMESTAMP"], where)
        prompt, output = _length(row["ContextTokens"], "ContextTokens", where), _length(row["GeneratedTokens"], "GeneratedTokens", where)
        if prompt and output:
            rows.add(t, prompt, output)
        else:
            rows.skipped += 1
    return rows


def read_burstgpt(p: Path, r: ReplayConfig, seed: int) -> _Rows:
    rows = _Rows("burstgpt")
    seen: dict[str, set[str]] = {"Model": set(), "Log Type": set()}
    wanted = {"Model": r.model, "Log Type": r.log_type}
    for line, where, row in _csv_rows(p, "burstgpt"):
        rows.count(p, line)
        t = _seconds(row["Timestamp"], "Timestamp", where)
        prompt = _length(row["Request tokens"], "Request tokens", where)
        output = _length(row["Response tokens"], "Response tokens", where)
        values = {c: row[c].strip() for c in wanted}
        for c, v in values.items():
            if len(seen[c]) < 20:
                seen[c].add(v)
        if any(w is not None and values[c].casefold() != w.casefold() for c, w in wanted.items()):
            continue
        if prompt and output:
            rows.add(t, prompt, output)
        else:
            rows.skipped += 1
    if not rows.times and not rows.skipped and (r.model or r.log_type):
        have = "; ".join(f"{c}: {', '.join(sorted(v))}" for c, v in seen.items())
        raise ConfigError(f"{p}: no rows match traffic.replay.model={r.model!r}, log_type={r.log_type!r} (the file has {have})")
    return rows


def read_mooncake(p: Path, r: ReplayConfig, seed: int) -> _Rows:
    rows = _Rows("mooncake", per_s=1e3)
    try:
        with p.open(encoding="utf-8-sig") as f:
            for line, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                rows.count(p, line)
                _mooncake_row(rows, text, f"{p}:{line}", r.block_size, seed)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    return rows


def _mooncake_row(rows: _Rows, text: str, where: str, block: int, seed: int) -> None:
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"{where}: not a JSON object: {one_line(str(e))}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object like "
                          '{"timestamp": 0, "input_length": 512, "output_length": 64, "hash_ids": [0]}')
    missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    t = obj["timestamp"]
    t = t if isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= 10**15 else _seconds(t, "timestamp", where, 1e-3)
    prompt = _length(obj["input_length"], "input_length", where)
    output = _length(obj["output_length"], "output_length", where)
    hashes = obj.get("hash_ids")
    content: tuple[Segment, ...] = ()
    if hashes is not None:
        need = -(-prompt // block)
        if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise ConfigError(f"{where}: hash_ids must be a list of whole numbers")
        if len(hashes) != need:
            raise ConfigError(f"{where}: {len(hashes)} hash_ids for input_length {prompt}, which is {need} blocks of "
                              f"traffic.replay.block_size {block} (the block size the trace was written with?)")
        content = tuple((("mooncake", seed, h), min(block, prompt - k * block)) for k, h in enumerate(hashes))
    if prompt and output:
        rows.add(t, prompt, output, content=content)
    else:
        rows.skipped += 1


READERS = {"azure": read_azure, "burstgpt": read_burstgpt, "mooncake": read_mooncake}


# batchlab's own CSV (its reader predates the others and stays as strict as it was)
TRACE_COLUMNS = COLUMNS["batchlab"]
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
