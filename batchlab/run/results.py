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
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchlab.core.files import naming, write_atomic
from batchlab.errors import ConfigError
from batchlab.run.experiment import SCHEMA, digest
from batchlab.run.ledger import Point, Scan, append_synced, csv_text, nonempty, parse_key, read_records, rows_digest, scan_files
from batchlab.run.schema import KEY, LEDGER, REQUEST_COLUMNS, Key, canonical, cell
from batchlab.run.strategies import rank

if sys.platform != "win32":
    import fcntl


@dataclass(frozen=True)
class RenderedRows:
    """A point's request rows as the exact CSV text requests.csv gets. NOTE: rendered where the
    point ran (a Ray worker), so the one writing process only appends text, and one string, not
    thousands of dicts, travels back."""
    text: str
    count: int


def render_rows(req_rows: list[dict]) -> RenderedRows:
    return RenderedRows(csv_text([r[c] for c in REQUEST_COLUMNS] for r in req_rows), len(req_rows))


class ResultsDir:
    """The output directory of one experiment: CSVs appended point by point, config alongside.
    Every method that writes expects the caller to hold `writing()`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.requests_csv = self.path / "requests.csv"
        self.summary_csv = self.path / "summary.csv"
        self.experiment_json = self.path / "experiment.json"
        self.lock = self.path / ".lock"
        self.appended: dict[Key, tuple[int, int]] = {}    # points this object appended: byte offset and length in requests.csv

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
        return scan_files(self.requests_csv, self.summary_csv)

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
        record = {"format": 1, "schema": SCHEMA, "digest": digest(exp), "experiment": exp}
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
        if exp is None:                       # made by an older batchlab or by hand (no ledger): read as it is
            with self.summary_csv.open(newline="") as f:     # NOTE: any line end; only a ledger insists on EOL
                rows = list(csv.reader(f))
            header, records = (rows[0], rows[1:]) if rows else (None, [])
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
                self.write_text(config, recorded_config(tree, scan.points, digest(exp), where))
        return dropped

    def put_in_order(self, written: dict[Key, dict] | None = None) -> None:
        """Rewrite both files in canonical order if points landed out of it (a rerun point, or
        points that finished in another order on Ray). `written`: the summary rows this run
        appended; the summary header is rebuilt as appending them in canonical order would have
        built it (a point with a column the others lack widens it), so the bytes match a run
        that wrote them in order."""
        if self._reorder_own_points(written or {}):
            return
        scan = self.scan()
        if scan.header is None:
            return
        header = self._canonical_header(scan.header, list(scan.points), written or {})
        if scan.in_order and header == scan.header:
            return
        points = [scan.points[k] for k in sorted(scan.points, key=canonical)]
        if header == scan.header:
            self._rewrite(header, points)
            return
        self.write_text(self.requests_csv, csv_text([REQUEST_COLUMNS]) + "".join(r.raw for p in points for r in p.rows))
        self._write_summary(scan.header, header, [p.summary.fields for p in points])

    def _reorder_own_points(self, written: dict[Key, dict]) -> bool:
        """The fast path when every point in the files was appended by this object: move each
        point's request rows by the byte span recorded when it was appended, without parsing
        requests.csv again (on a large sweep that parse is most of what the writing process does).
        Returns False, changing nothing, when the files hold anything else."""
        header, records, intact = read_records(self.summary_csv)
        if header is None or not intact or not set(KEY) <= set(header):
            return False
        at = tuple(header.index(c) for c in KEY)
        keys = [parse_key(r.fields, at) for r in records]
        if len(set(keys)) != len(keys) or set(keys) != set(self.appended) or \
                self.requests_csv.stat().st_size != len(csv_text([REQUEST_COLUMNS]).encode()) + sum(n for _, n in self.appended.values()):
            return False
        order = sorted(keys, key=canonical)
        canon = self._canonical_header(header, order, written)
        if order == keys and canon == header:
            return True
        with self.requests_csv.open("rb") as f:
            parts = []
            for key in order:
                start, length = self.appended[key]
                f.seek(start)
                parts.append(f.read(length))
        self.write_text(self.requests_csv, csv_text([REQUEST_COLUMNS]) + b"".join(parts).decode("utf-8"))
        by_key = dict(zip(keys, records))
        self._write_summary(header, canon, [by_key[k].fields for k in order])
        offset = len(csv_text([REQUEST_COLUMNS]).encode())
        for key, part in zip(order, parts):
            self.appended[key] = (offset, len(part))
            offset += len(part)
        return True

    def _write_summary(self, old: list[str], header: list[str], records: list[list[str]]) -> None:
        rows = [dict(zip(old, fields)) for fields in records]
        self.write_text(self.summary_csv, csv_text([header, *([row.get(c, "") for c in header] for row in rows)]))

    @staticmethod
    def _canonical_header(header: list[str], keys: list[Key], written: dict[Key, dict]) -> list[str]:
        """The header of points appended in canonical order: the first point's columns, then each
        column a later point adds. A point not written by this run counts as having every column."""
        out: list[str] = []
        for key in sorted(keys, key=canonical):
            out += [c for c in (written[key] if key in written else header) if c not in out]
        return out

    def append_point(self, req_rows: list[dict] | RenderedRows, summary_row: dict) -> dict[str, Any]:
        """Append one point: request rows first, then the summary row that vouches for them.
        Returns the summary row with its ledger (count and digest of the request rows)."""
        rendered = req_rows if isinstance(req_rows, RenderedRows) else render_rows(req_rows)
        text = rendered.text
        ledger = {"num_rows": rendered.count, "rows_digest": rows_digest(text)}
        row = {k: cell(v) for k, v in summary_row.items() if k not in LEDGER} | ledger
        head = "" if nonempty(self.requests_csv) else csv_text([REQUEST_COLUMNS])
        start = (self.requests_csv.stat().st_size if self.requests_csv.exists() else 0) + len(head.encode())
        with naming(self.requests_csv):
            append_synced(self.requests_csv, head + text)
        key = (summary_row["strategy"], float(summary_row["rate"]), int(summary_row["repeat"]))
        self.appended[key] = (start, len(text.encode()))
        header, _, _ = read_records(self.summary_csv)
        with naming(self.summary_csv):
            if header is None:
                header = list(row)
                append_synced(self.summary_csv, csv_text([header]))
            elif set(row) - set(header):     # a fact earlier points lacked: widen the header, not drop it
                header = self._widen(header, [k for k in row if k not in header])
            append_synced(self.summary_csv, csv_text([[row.get(c, "") for c in header]]))
        return summary_row | ledger

    def write_text(self, path: Path, text: str) -> None:
        """Atomic (core/files.py): readers see the old file or the new one."""
        write_atomic(path, text)

    def _widen(self, header: list[str], new: list[str]) -> list[str]:
        _, records, _ = read_records(self.summary_csv)
        wide = header + new
        self.write_text(self.summary_csv, csv_text([wide, *(rec.fields + [""] * len(new) for rec in records)]))
        return wide

    def _rewrite(self, header: list[str] | None, points: list[Point]) -> None:
        if not points or header is None:
            for p in (self.requests_csv, self.summary_csv):
                p.unlink(missing_ok=True)
            return
        # NOTE: records are written back as read, byte for byte: nothing is re-formatted
        self.write_text(self.requests_csv, csv_text([REQUEST_COLUMNS]) + "".join(r.raw for p in points for r in p.rows))
        self.write_text(self.summary_csv, csv_text([header]) + "".join(p.summary.raw for p in points))


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


def recorded_config(tree: dict[str, Any], keys: Iterable[Key], digest: str, where: Path) -> str:
    """config.yaml: the config `tree` (experiment.config_tree) with strategies, rates and repeats
    set to those of the points recorded, so the file tells what the directory holds, not what the
    last command asked for; `out` is the directory itself: `batchlab run config.yaml` reruns it."""
    keys = sorted(keys, key=canonical)
    tree = json.loads(json.dumps(tree)) | {"out": str(Path(where).resolve())}   # the real directory
    tree.get("backend", {}).pop("api_key", None)      # NOTE: a secret is never written to disk
    strategies = sorted({k[0] for k in keys}, key=rank)
    rates = sorted({k[1] for k in keys})
    repeats = max(k[2] for k in keys) + 1
    tree["strategies"] = strategies
    traffic = tree.setdefault("traffic", {})
    closed = traffic.get("arrival") == "closed"     # its levels are user counts
    traffic.update({"concurrency": [int(r) for r in rates]} if closed else {"rates": rates}, repeats=repeats)
    unit = "users" if closed else "req/s"
    have = set(keys)
    missing = [(s, r, p) for r in rates for p in range(repeats) for s in strategies if (s, r, p) not in have]
    head = [f"# Experiment {digest} (identity in experiment.json). strategies, traffic.{'concurrency' if closed else 'rates'} and",
            "# traffic.repeats are those of the points recorded in summary.csv."]
    if missing:
        listed = ", ".join(f"{s} @ {r:g} {unit} repeat {p}" for s, r, p in missing[:6])
        head.append(f"# Not recorded: {listed}" + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    return "\n".join(head) + "\n" + yaml.dump(tree, Dumper=_DUMPER, sort_keys=False)


_DUMPER = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper   # libyaml: 10x faster, same YAML
