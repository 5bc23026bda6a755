"""The ledger: reading requests.csv and summary.csv back, and finding what a crash left behind.

A point's request rows are appended (and fsynced) before its summary row, which carries their
count and digest (LEDGER columns). `scan_files` keeps only points whose summary record is
complete and whose rows are all there, byte for byte; a torn record (no line end), a quote left
open, a duplicate or a count/digest mismatch marks the point for a rerun, never trusted.
"""
from __future__ import annotations

import csv
import hashlib
import io
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from batchlab.core.files import fsync_dir
from batchlab.run.schema import KEY, LEDGER, REQUEST_COLUMNS, STRATEGY_NAME, Key, canonical

EOL = "\r\n"                              # the csv module's line terminator; a row without it is torn


def csv_text(records: Iterable[Iterable[Any]]) -> str:
    buf = io.StringIO(newline="")
    csv.writer(buf, lineterminator=EOL).writerows(records)
    return buf.getvalue()


def rows_digest(text: str) -> str:
    # NOTE: prefixed so pandas never reads the column as a number (hex like '12e4...' parses as a float)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


class Record(NamedTuple):
    """One CSV record: its fields and the exact text it was read from (line end included)."""
    fields: list[str]
    raw: str


def read_records(path: Path) -> tuple[list[str] | None, list[Record], bool]:
    """(header, complete records, intact). A record whose text does not end in EOL is torn (a cut
    file's last line); after a parse error (a quote left open at the end) nothing more is read."""
    if not path.is_file():
        return None, [], True
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = io.StringIO(text, newline="").readlines()      # physical lines, line ends kept as written
    reader = csv.reader(lines, strict=True)
    records, intact, used = [], True, 0
    try:
        for fields in reader:
            raw, used = "".join(lines[used:reader.line_num]), reader.line_num
            if not raw.endswith(EOL):
                intact = False
                continue
            records.append(Record(fields, raw))
    except csv.Error:
        intact = False
    header = records[0].fields if records else None
    return header, records[1:], intact and (bool(records) or not text)


def parse_key(rec: list[str], at: tuple[int, int, int]) -> Key | None:
    try:
        strategy, rate, repeat = rec[at[0]], float(rec[at[1]]), int(rec[at[2]])
    except (IndexError, ValueError):
        return None
    ok = STRATEGY_NAME.match(strategy) is not None and math.isfinite(rate) and rate > 0 and repeat >= 0
    return (strategy, rate, repeat) if ok else None


@dataclass
class Point:
    """One recorded point: its summary record and its request records, kept as read."""
    key: Key
    summary: Record
    rows: list[Record]


@dataclass
class Scan:
    """What a results directory holds: the points whose rows are all there and intact (in file
    order), the points found incomplete (to rerun), and whether the files need rewriting."""
    header: list[str] | None = None
    points: dict[Key, Point] = field(default_factory=dict)
    dropped: list[Key] = field(default_factory=list)
    clean: bool = True

    @property
    def done(self) -> dict[Key, str]:
        """(strategy, rate, repeat) -> point_hash of every intact point."""
        at = self.header.index("point_hash") if self.header and "point_hash" in self.header else None
        return {k: p.summary.fields[at] if at is not None else "" for k, p in self.points.items()}

    @property
    def in_order(self) -> bool:
        return list(self.points) == sorted(self.points, key=canonical)


def older_schema(header: list[str] | None) -> bool:
    """requests.csv written by an earlier batchlab: columns are only ever added at the end, so
    its header is a proper prefix of today's and its rows read as today's with empty new cells."""
    return header is not None and len(header) < len(REQUEST_COLUMNS) and REQUEST_COLUMNS[:len(header)] == header


def _upgraded(rows: list[Record], summary: Record, header: list[str]) -> tuple[list[Record], Record]:
    """An older point's rows with today's columns (empty), and its summary row's ledger redone."""
    pad = len(REQUEST_COLUMNS) - len(rows[0].fields) if rows else 0
    new = []
    for r in rows:
        body = r.raw.rstrip("\r\n")
        new.append(Record(r.fields + [""] * pad, body + "," * pad + r.raw[len(body):]))
    fields = list(summary.fields)
    fields[header.index("num_rows")] = str(len(new))
    fields[header.index("rows_digest")] = rows_digest("".join(r.raw for r in new))
    return new, Record(fields, csv_text([fields]))


def scan_files(requests_csv: Path, summary_csv: Path) -> Scan:
    req_header, req_records, req_intact = read_records(requests_csv)
    at = tuple(REQUEST_COLUMNS.index(c) for c in KEY)
    groups: dict[Key, list[Record]] = {}
    runs: list[Key | None] = []             # the key of each run of consecutive rows, in file order
    cols = req_header if older_schema(req_header) else REQUEST_COLUMNS
    stray = not req_intact or (req_records and req_header != cols)
    for rec in req_records if req_header == cols else []:
        key = parse_key(rec.fields, at) if len(rec.fields) == len(cols) else None
        if key is None:
            stray = True
            continue
        groups.setdefault(key, []).append(rec)
        if not runs or runs[-1] != key:
            runs.append(key)
    header, records, intact = read_records(summary_csv)
    scan = Scan(header=header, clean=intact and not stray and len(runs) == len(groups))
    if header is not None and not set(KEY + LEDGER) <= set(header):
        scan.header, scan.clean = None, False      # not a ledger batchlab wrote: nothing in it is trusted
    elif header is not None:
        sat = tuple(header.index(c) for c in KEY)
        count, digest = header.index("num_rows"), header.index("rows_digest")
        keys = [parse_key(rec.fields, sat) if len(rec.fields) == len(header) else None for rec in records]
        seen = Counter(keys)
        for key, rec in zip(keys, records):
            rows = groups.get(key, [])
            ledger = rec.fields[count], rec.fields[digest]
            if key is None or seen[key] > 1 or ledger != (str(len(rows)), rows_digest("".join(r.raw for r in rows))):
                scan.clean = False
                if key is not None and key not in scan.dropped:
                    scan.dropped.append(key)
                continue
            if cols is not REQUEST_COLUMNS:  # verified as written, then carried over to today's columns
                rows, rec = _upgraded(rows, rec, header)
                scan.clean = False
            scan.points[key] = Point(key, rec, rows)
    for key in groups:
        if key not in scan.points and key not in scan.dropped:
            scan.dropped.append(key)
            scan.clean = False
    if scan.clean and runs != list(scan.points):
        scan.clean = False                  # request rows not in the summary's order
    return scan



def nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def append_synced(path: Path, text: str) -> None:
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if new:
        fsync_dir(path.parent)
