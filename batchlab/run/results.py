"""The results directory: one experiment, its CSV schema, and a ledger that survives a crash.

A directory holds one experiment. `experiment.json` records its identity: the whole config except
what may grow inside it (rates, repeats, strategies) and what does not change a result (name, out,
report, the API key), plus a digest of every input file. A run with another identity is refused.
`requests.csv` holds one row per request (REQUEST_COLUMNS), `summary.csv` one row per point. A
point's summary row is appended (and fsynced) after its request rows and carries their count and
digest, so a torn row, a point without its summary row or a point missing request rows is found on
the next run (`scan`) and that point is rerun, never trusted. Rewrites go through a temp file,
fsync and os.replace, and keep points in canonical order, so a resumed sweep writes the same bytes
as an uninterrupted one.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, get_args

import numpy as np
import yaml

from batchlab.core.breakdown import PHASES
from batchlab.core.config import RunConfig, Strategy
from batchlab.core.metrics import per_request
from batchlab.core.request import Request
from batchlab.errors import ConfigError

if sys.platform != "win32":
    import fcntl

REQUEST_COLUMNS = [
    "request_id", "strategy", "rate", "repeat", "seed", "backend", "model", "knobs", "point_hash",
    "status", "error", "warmup", "prompt_len", "output_len", "max_new_tokens",
    "arrival_time", "scheduled_time", "first_token_time", "completion_time",
    "queue_wait", "ttft", "tpot", "e2e", "itl_max", "num_preemptions", "trigger",
    *PHASES,
]
KEY = ("strategy", "rate", "repeat")
LEDGER = ("num_rows", "rows_digest")      # the last two columns of a summary row: its request rows' count and digest
STRATEGY_RANK = {s: i for i, s in enumerate(get_args(Strategy))}
GROWS = ("strategies", "traffic.rates", "traffic.repeats")       # may grow inside one experiment
NO_EFFECT = ("name", "out", "report", "backend.api_key")        # do not change what a point means
INPUT_FILES = ("traffic.trace_file", "backend.profile", "traffic.prompt_len.path", "traffic.output_len.path")
EOL = "\r\n"                              # the csv module's line terminator; a row without it is torn

Key = tuple[str, float, int]


def canonical(key: Key) -> tuple:
    """The order points are written in: rate, then repeat, then strategy (naive, dynamic, ...)."""
    strategy, rate, repeat = key
    return rate, repeat, STRATEGY_RANK[strategy]


def point_hash(cfg: RunConfig, strategy: str) -> str:
    """Digest of everything that shapes one strategy's points (not the list of rates/repeats)."""
    shape = {"backend": cfg.backend.model_dump(exclude={"api_key"}), "knobs": cfg.knobs(strategy),
             "traffic": cfg.traffic.model_dump(exclude={"rates", "repeats"}), "slo": cfg.slo.model_dump()}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ---- experiment identity -------------------------------------------------------------------------

def experiment(cfg: RunConfig) -> dict[str, Any]:
    """What a point of this config means: the config less GROWS and NO_EFFECT, plus the content
    digest of each input file it reads (an edited trace is another experiment)."""
    tree = cfg.model_dump(mode="json")
    for dotted in GROWS + NO_EFFECT:
        *parents, leaf = dotted.split(".")
        node = _get(tree, ".".join(parents)) if parents else tree
        if isinstance(node, dict):
            node.pop(leaf, None)
    inputs = {k: _file_digest(v) for k in INPUT_FILES if (v := _get(tree, k))}
    return json.loads(json.dumps(tree | {"input_files": inputs}))


def experiment_digest(exp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(exp, sort_keys=True).encode()).hexdigest()[:12]


def differences(there: dict[str, Any], now: dict[str, Any], limit: int = 4) -> str:
    """`dynamic.max_wait_ms: 50.0 there, 20.0 now; ...`, the keys two experiments differ in."""
    a, b = dict(_flat(there)), dict(_flat(now))
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]
    shown = [f"{k}: {_show(a.get(k, _ABSENT))} there, {_show(b.get(k, _ABSENT))} now" for k in keys[:limit]]
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(shown) + more


_ABSENT = object()


def _show(v: Any) -> str:
    return "absent" if v is _ABSENT else v if isinstance(v, str) else json.dumps(v)


def _flat(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _get(tree: dict, dotted: str) -> Any:
    for k in dotted.split("."):
        tree = tree.get(k) if isinstance(tree, dict) else None
    return tree


def _file_digest(path: str) -> str:
    try:
        return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "unreadable"          # the stage that reads the file says why, in one line


def recorded_config(tree: dict[str, Any], keys: Iterable[Key], digest: str, where: Path) -> str:
    """config.yaml: the config `tree` with strategies, rates and repeats set to those of the points
    recorded, so the file tells what the directory holds, not what the last command asked for."""
    keys = sorted(keys, key=canonical)
    tree = json.loads(json.dumps(tree)) | {"out": str(where)}
    tree.get("backend", {}).pop("api_key", None)      # NOTE: a secret is never written to disk
    strategies = sorted({k[0] for k in keys}, key=STRATEGY_RANK.get)
    rates = sorted({k[1] for k in keys})
    repeats = max(k[2] for k in keys) + 1
    tree["strategies"] = strategies
    tree.setdefault("traffic", {}).update(rates=rates, repeats=repeats)
    have = set(keys)
    missing = [(s, r, p) for r in rates for p in range(repeats) for s in strategies if (s, r, p) not in have]
    head = [f"# Experiment {digest} (identity in experiment.json). strategies, traffic.rates and",
            "# traffic.repeats are those of the points recorded in summary.csv."]
    if missing:
        listed = ", ".join(f"{s} @ {r:g} req/s repeat {p}" for s, r, p in missing[:6])
        head.append(f"# Not recorded: {listed}" + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    return "\n".join(head) + "\n" + yaml.dump(tree, Dumper=_DUMPER, sort_keys=False)


_DUMPER = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper   # libyaml: 10x faster, same YAML


# ---- rows ----------------------------------------------------------------------------------------

def _fmt(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(float(v))              # numpy floats repr as 'np.float64(...)'
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def summary_row(cfg: RunConfig, strategy: str, rate: float, repeat: int, model: str,
                summary: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One point's row of summary.csv: its key and settings, the metrics, then backend facts."""
    return {"strategy": strategy, "rate": rate, "repeat": repeat, "seed": cfg.traffic.seed,
            "backend": cfg.backend.kind, "model": model, "point_hash": point_hash(cfg, strategy),
            **summary, **(meta or {})}


def request_rows(cfg: RunConfig, strategy: str, rate: float, repeat: int, requests: list[Request],
                 model: str) -> list[dict]:
    common = {"strategy": strategy, "rate": rate, "repeat": repeat, "seed": cfg.traffic.seed,
              "backend": cfg.backend.kind, "model": model, "point_hash": point_hash(cfg, strategy),
              "knobs": ";".join(f"{k}={v}" for k, v in cfg.knobs(strategy).items())}
    rows = []
    for r in requests:
        m = per_request(r)
        gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
        row = common | m | {
            "request_id": r.request_id, "status": r.status.value, "error": r.error or "",
            "warmup": r.arrival_time < cfg.traffic.warmup_s, "prompt_len": r.prompt_len,
            "output_len": r.output_len, "max_new_tokens": r.max_new_tokens,
            "arrival_time": r.arrival_time, "scheduled_time": r.scheduled_time,
            "first_token_time": r.first_token_time, "completion_time": r.completion_time,
            "itl_max": max(gaps) if gaps else None, "num_preemptions": r.num_preemptions,
            "trigger": r.trigger,
        }
        for phase in PHASES:
            row[phase] = r.breakdown.get(phase, 0.0 if r.status.value == "finished" else None)
        rows.append({k: _fmt(row.get(k)) for k in REQUEST_COLUMNS})
    return rows


def _csv_text(records: Iterable[Iterable[Any]]) -> str:
    buf = io.StringIO(newline="")
    csv.writer(buf, lineterminator=EOL).writerows(records)
    return buf.getvalue()


def _rows_digest(text: str) -> str:
    # NOTE: prefixed so pandas never reads the column as a number (hex like '12e4...' parses as a float)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


class Record(NamedTuple):
    """One CSV record: its fields and the exact text it was read from (line end included)."""
    fields: list[str]
    raw: str


def _records(path: Path) -> tuple[list[str] | None, list[Record], bool]:
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


def _key(rec: list[str], at: tuple[int, int, int]) -> Key | None:
    try:
        strategy, rate, repeat = rec[at[0]], float(rec[at[1]]), int(rec[at[2]])
    except (IndexError, ValueError):
        return None
    ok = strategy in STRATEGY_RANK and math.isfinite(rate) and rate > 0 and repeat >= 0
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


def _scan(requests_csv: Path, summary_csv: Path) -> Scan:
    req_header, req_records, req_intact = _records(requests_csv)
    at = tuple(REQUEST_COLUMNS.index(c) for c in KEY)
    groups: dict[Key, list[Record]] = {}
    runs: list[Key | None] = []             # the key of each run of consecutive rows, in file order
    stray = not req_intact or (req_records and req_header != REQUEST_COLUMNS)
    for rec in req_records if req_header == REQUEST_COLUMNS else []:
        key = _key(rec.fields, at) if len(rec.fields) == len(REQUEST_COLUMNS) else None
        if key is None:
            stray = True
            continue
        groups.setdefault(key, []).append(rec)
        if not runs or runs[-1] != key:
            runs.append(key)
    header, records, intact = _records(summary_csv)
    scan = Scan(header=header, clean=intact and not stray and len(runs) == len(groups))
    if header is not None and not set(KEY + LEDGER) <= set(header):
        scan.header, scan.clean = None, False      # not a ledger batchlab wrote: nothing in it is trusted
    elif header is not None:
        sat = tuple(header.index(c) for c in KEY)
        count, digest = header.index("num_rows"), header.index("rows_digest")
        keys = [_key(rec.fields, sat) if len(rec.fields) == len(header) else None for rec in records]
        seen = Counter(keys)
        for key, rec in zip(keys, records):
            rows = groups.get(key, [])
            ledger = rec.fields[count], rec.fields[digest]
            if key is None or seen[key] > 1 or ledger != (str(len(rows)), _rows_digest("".join(r.raw for r in rows))):
                scan.clean = False
                if key is not None and key not in scan.dropped:
                    scan.dropped.append(key)
                continue
            scan.points[key] = Point(key, rec, rows)
    for key in groups:
        if key not in scan.points and key not in scan.dropped:
            scan.dropped.append(key)
            scan.clean = False
    if scan.clean and runs != list(scan.points):
        scan.clean = False                  # request rows not in the summary's order
    return scan


# ---- the directory -------------------------------------------------------------------------------

class ResultsDir:
    """The output directory of one experiment: CSVs appended point by point, config alongside.
    Every method that writes expects the caller to hold `writing()`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.requests_csv = self.path / "requests.csv"
        self.summary_csv = self.path / "summary.csv"
        self.experiment_json = self.path / "experiment.json"
        self.lock = self.path / ".lock"

    def has_results(self) -> bool:
        return any(p.is_file() and p.stat().st_size for p in (self.requests_csv, self.summary_csv))

    def recorded_experiment(self) -> dict[str, Any] | None:
        """The identity stored in experiment.json; None if there is none."""
        if not self.experiment_json.is_file():
            return None
        try:
            return json.loads(self.experiment_json.read_text())["experiment"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{self.experiment_json}: unreadable; this directory cannot be resumed, "
                              "use another --out") from None

    def scan(self) -> Scan:
        return _scan(self.requests_csv, self.summary_csv)

    def done_points(self) -> dict[Key, str]:
        """(strategy, rate, repeat) -> point_hash of every intact point."""
        scan = self.scan()
        return scan.done if scan.points else {}

    def busy(self) -> bool:
        """Whether another process holds `writing()` on this directory (checked without writing)."""
        if sys.platform == "win32" or not self.lock.is_file():
            return False
        fd = os.open(self.lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Create the directory and hold its lock: one writer at a time (no lock on Windows)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if sys.platform == "win32":
            yield
            return
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(f"{self.path}: another batchlab process is writing here; wait for it to end") from None
            yield
        finally:
            os.close(fd)

    def claim(self, exp: dict[str, Any]) -> None:
        """Record the experiment this directory holds (once, or again while it holds no point)."""
        if self.experiment_json.is_file() and self.recorded_experiment() == exp:
            return
        record = {"format": 1, "digest": experiment_digest(exp), "experiment": exp}
        self.write_text(self.experiment_json, json.dumps(record, indent=2) + "\n")

    def repair(self, scan: Scan) -> list[Key]:
        """Drop every incomplete point and torn row (their points will be rerun); returns them."""
        for stale in self.path.glob(".*.tmp"):
            stale.unlink()
        if not scan.clean or not scan.in_order:
            self._rewrite(scan.header, [scan.points[k] for k in sorted(scan.points, key=canonical)])
        return scan.dropped

    def tidy(self) -> list[Key]:
        """For a reader (`batchlab report`): refuse what is not a results directory, drop the
        incomplete points a killed run left (as the next run would) and return them."""
        exp = self.recorded_experiment()
        if not self.summary_csv.is_file():
            what = ("no such directory" if not self.path.exists() else "no finished point yet" if exp is not None
                    else "not a batchlab results directory")
            raise ConfigError(f"{self.path}: no summary.csv ({what}; run `batchlab run --out {self.path}` first)")
        if exp is None:                       # made by an older batchlab (no ledger): read as it is
            header, records, _ = _records(self.summary_csv)
            if not records or not {*KEY, "point_hash", "num_requests"} <= set(header or ()):
                raise ConfigError(f"{self.path}: not a batchlab results directory (summary.csv has no point "
                                  "rows with the columns batchlab writes)")
            return []
        if self.busy():
            raise ConfigError(f"{self.path}: a sweep is writing here; report when it has finished")
        scan = self.scan()
        if scan.clean:
            return []
        with self.writing():
            scan = self.scan()
            dropped = self.repair(scan)
            config = self.path / "config.yaml"
            if not scan.points:
                config.unlink(missing_ok=True)
                raise ConfigError(f"{self.path}: no finished point ({len(dropped)} incomplete, left by a killed run); "
                                  f"rerun the sweep with --out {self.path} to complete them")
            if config.is_file():
                tree = yaml.safe_load(config.read_text()) or {}
                where = Path(tree.get("out") or self.path)
                self.write_text(config, recorded_config(tree, scan.points, experiment_digest(exp), where))
        return dropped

    def put_in_order(self) -> None:
        """Rewrite both files in canonical order if a rerun point landed after a later one."""
        scan = self.scan()
        if not scan.in_order:
            self._rewrite(scan.header, [scan.points[k] for k in sorted(scan.points, key=canonical)])

    def append_point(self, req_rows: list[dict], summary_row: dict) -> dict[str, Any]:
        """Append one point: request rows first, then the summary row that vouches for them.
        Returns the summary row with its ledger (count and digest of the request rows)."""
        text = _csv_text([r[c] for c in REQUEST_COLUMNS] for r in req_rows)
        ledger = {"num_rows": len(req_rows), "rows_digest": _rows_digest(text)}
        row = {k: _fmt(v) for k, v in summary_row.items() if k not in LEDGER} | ledger
        head = "" if _nonempty(self.requests_csv) else _csv_text([REQUEST_COLUMNS])
        _append(self.requests_csv, head + text)
        header, _, _ = _records(self.summary_csv)
        if header is None:
            header = list(row)
            _append(self.summary_csv, _csv_text([header]))
        elif set(row) - set(header):         # a fact earlier points lacked: widen the header, not drop it
            header = self._widen(header, [k for k in row if k not in header])
        _append(self.summary_csv, _csv_text([[row.get(c, "") for c in header]]))
        return summary_row | ledger

    def write_text(self, path: Path, text: str) -> None:
        """Atomic: a temp file, fsync, os.replace; readers see the old file or the new one.
        A file that already holds `text` is left alone."""
        data = text.encode("utf-8")
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def _widen(self, header: list[str], new: list[str]) -> list[str]:
        _, records, _ = _records(self.summary_csv)
        wide = header + new
        self.write_text(self.summary_csv, _csv_text([wide, *(rec.fields + [""] * len(new) for rec in records)]))
        return wide

    def _rewrite(self, header: list[str] | None, points: list[Point]) -> None:
        if not points or header is None:
            for p in (self.requests_csv, self.summary_csv):
                p.unlink(missing_ok=True)
            return
        # NOTE: records are written back as read, byte for byte: nothing is re-formatted
        self.write_text(self.requests_csv, _csv_text([REQUEST_COLUMNS]) + "".join(r.raw for p in points for r in p.rows))
        self.write_text(self.summary_csv, _csv_text([header]) + "".join(p.summary.raw for p in points))


def _nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def _append(path: Path, text: str) -> None:
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if new:
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    if sys.platform == "win32":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_location(path: Path) -> None:
    """An output directory must be a directory we can write in, or a path where one can be made.
    Checked before anything is written; the probe is an unnamed temp file, gone when closed."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output directory {path}: is a file, not a directory")
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise ConfigError(f"output directory {path}: {probe} is a broken link")
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"output directory {path}: {probe} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"output directory {path}: cannot write in {probe} ({e.strerror or e})") from None
