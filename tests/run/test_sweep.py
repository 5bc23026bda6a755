import csv
import os
import shutil
from pathlib import Path

import pytest
import yaml

from batchlab.errors import ConfigError
from batchlab.run import sweep
from batchlab.run.config import load_config, load_user_config
from batchlab.run.results import ResultsDir
from batchlab.run.schema import REQUEST_COLUMNS
from batchlab.run.sweep import execute, plan_sweep, run_sweep

SMALL = ["traffic.rates=[5, 20]", "traffic.duration_s=20", "traffic.warmup_s=2", "report=false",
         "traffic.output_len={dist: uniform, low: 8, high: 64}"]


def test_same_config_and_seed_give_byte_identical_requests_csv(tmp_path):
    cfg = load_config(None, SMALL)
    run_sweep(cfg, tmp_path / "a")
    run_sweep(cfg, tmp_path / "b")
    a = (tmp_path / "a" / "requests.csv").read_bytes()
    assert a == (tmp_path / "b" / "requests.csv").read_bytes()
    rows = list(csv.DictReader((tmp_path / "a" / "requests.csv").open()))
    assert set(REQUEST_COLUMNS) <= set(rows[0])
    assert {r["strategy"] for r in rows} == {"naive", "dynamic", "continuous"}
    assert all(r["knobs"] and r["seed"] == "0" for r in rows)
    # every strategy saw exactly the same trace at each rate
    by = {}
    for r in rows:
        by.setdefault((r["strategy"], r["rate"]), []).append((r["arrival_time"], r["prompt_len"], r["max_new_tokens"]))
    assert by[("naive", "5.0")] == by[("dynamic", "5.0")] == by[("continuous", "5.0")]


def test_rerun_skips_finished_points_and_adding_a_rate_runs_only_it(tmp_path):
    out = tmp_path / "r"
    run_sweep(load_config(None, SMALL), out)
    before = (out / "requests.csv").read_bytes()
    seen = []
    run_sweep(load_config(None, SMALL), out, on_point=lambda p: seen.append(p.summary))
    assert seen == [] and (out / "requests.csv").read_bytes() == before
    run_sweep(load_config(None, SMALL + ["traffic.rates=[5, 20, 40]"]), out, on_point=lambda p: seen.append(p.summary))
    assert [s["rate"] for s in seen] == [40.0, 40.0, 40.0]
    assert (out / "requests.csv").read_bytes().startswith(before)


def test_a_point_killed_mid_write_is_dropped_and_rerun(tmp_path):
    out = tmp_path / "r"
    cfg = load_config(None, SMALL)
    run_sweep(cfg, out)
    full = (out / "requests.csv").read_bytes()
    summary = (out / "summary.csv").read_text().splitlines()
    (out / "summary.csv").write_text("\n".join(summary[:-1]) + "\n")   # last point lost its summary row
    run_sweep(cfg, out)
    assert (out / "requests.csv").read_bytes() == full
    assert len(ResultsDir(out).done_points()) == 6


def test_changed_settings_are_refused_not_mixed(tmp_path):
    out = tmp_path / "r"
    run_sweep(load_config(None, SMALL), out)
    before = (out / "summary.csv").read_bytes()
    with pytest.raises(ConfigError, match="different settings"):
        run_sweep(load_config(None, SMALL + ["naive.batch_size=4"]), out)
    assert (out / "summary.csv").read_bytes() == before


def test_warmup_rows_are_flagged_and_excluded_from_the_summary(tmp_path):
    out = tmp_path / "r"
    run_sweep(load_config(None, SMALL + ["strategies=[continuous]", "traffic.rates=[5]"]), out)
    rows = list(csv.DictReader((out / "requests.csv").open()))
    warm = [r for r in rows if r["warmup"] == "1"]
    assert warm and all(float(r["arrival_time"]) < 2 for r in warm)
    summ = list(csv.DictReader((out / "summary.csv").open()))[0]
    assert int(summ["num_requests"]) == len(rows) - len(warm)


def test_numpy_values_are_written_as_plain_numbers():
    import numpy as np

    from batchlab.run.schema import cell as _fmt
    assert _fmt(np.float64(0.5)) == "0.5" and _fmt(np.int64(3)) == 3 and _fmt(np.bool_(True)) == 1
    assert _fmt(float("nan")) == "" and _fmt(None) == ""


def test_a_replayed_trace_resumes_too(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0.0,10,3\n0.5,20,4\n1.0,30,5\n")
    overrides = ["traffic.arrival=trace", f"traffic.trace_file={trace}", "traffic.warmup_s=0", "report=false"]
    out = tmp_path / "r"
    run_sweep(load_config(None, overrides), out)
    before = (out / "requests.csv").read_bytes()
    seen = []
    run_sweep(load_config(None, overrides), out, on_point=seen.append)
    assert seen == [] and (out / "requests.csv").read_bytes() == before
    rates = {row["rate"] for row in csv.DictReader((out / "summary.csv").open())}
    assert rates == {"3.0"}      # three requests over one second: the trace's mean rate


# ---- one experiment per directory ------------------------------------------------------------------

FAST = ["traffic.duration_s=10", "traffic.warmup_s=2", "report=false"]


def test_the_readme_sequence_cannot_mix_two_experiments(tmp_path):
    """`make run`, then `batchlab run --set traffic.rates=[2,8,32] --set dynamic.max_wait_ms=20`:
    out is results/latest, a link; each experiment gets its own directory."""
    latest = tmp_path / "results" / "latest"
    first = run_sweep(load_user_config(None, FAST), latest)
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    second = run_sweep(load_user_config(None, FAST + ["traffic.rates=[2,8,32]", "dynamic.max_wait_ms=20"]), latest)
    assert first != second and first.parent == second.parent == latest.parent
    assert os.readlink(latest) == second.name                       # relative: the tree can move
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    assert {r["rate"] for r in csv.DictReader((latest / "summary.csv").open())} == {"2.0", "8.0", "32.0"}
    config = yaml.safe_load((latest / "config.yaml").read_text())
    assert config["dynamic"]["max_wait_ms"] == 20 and config["traffic"]["rates"] == [2, 8, 32]
    assert config["out"] == str(second)
    seen = []
    assert run_sweep(load_user_config(None, FAST), latest, on_point=seen.append) == first   # resumes the first
    assert seen == [] and os.readlink(latest) == first.name


def test_changed_settings_name_the_keys_and_leave_the_directory_as_it_was(tmp_path):
    out = tmp_path / "r"
    run_sweep(load_config(None, SMALL), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ConfigError) as e:
        run_sweep(load_config(None, SMALL + ["dynamic.max_wait_ms=20", "traffic.rates=[2]"]), out)
    message = str(e.value)
    assert "holds another experiment" in message and "dynamic.max_wait_ms: 50.0 there, 20.0 now" in message
    assert "traffic.rates" not in message and f"use --out {tmp_path}/batchlab-" in message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_growing_an_experiment_resumes_and_ends_as_one_uninterrupted_run(tmp_path):
    grown = ["strategies=[dynamic, naive]", "traffic.rates=[20, 5]", "traffic.repeats=2"]
    full = run_sweep(load_config(None, SMALL + grown), tmp_path / "full")
    out = tmp_path / "r"
    run_sweep(load_config(None, SMALL + ["strategies=[naive]", "traffic.rates=[20]"]), out)
    seen = []
    run_sweep(load_config(None, SMALL + grown), out, on_point=lambda p: seen.append(p.summary["rate"]))
    assert len(seen) == 7                                            # 8 points, 1 already there
    assert (out / "requests.csv").read_bytes() == (full / "requests.csv").read_bytes()   # canonical order
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["strategies"] == ["naive", "dynamic"] and config["traffic"]["rates"] == [5, 20]
    assert config["traffic"]["repeats"] == 2
    run_sweep(load_config(None, SMALL + ["strategies=[naive]", "traffic.rates=[40]"]), out)
    text = (out / "config.yaml").read_text()
    assert yaml.safe_load(text)["traffic"]["rates"] == [5, 20, 40]
    assert "# Not recorded: dynamic @ 40 req/s repeat 0, naive @ 40 req/s repeat 1, dynamic @ 40 req/s repeat 1" in text


def test_a_directory_without_an_experiment_record_is_refused(tmp_path):
    out = tmp_path / "r"
    run_sweep(load_config(None, SMALL), out)
    (out / "experiment.json").unlink()                              # as an older batchlab left it
    with pytest.raises(ConfigError, match="without an experiment record"):
        run_sweep(load_config(None, SMALL), out)


def test_a_directory_with_no_finished_point_is_taken_over(tmp_path, monkeypatch):
    out = tmp_path / "r"
    monkeypatch.setattr(sweep, "run_point", _dies_after(0))
    with pytest.raises(Killed):
        run_sweep(load_config(None, SMALL), out)
    monkeypatch.undo()
    assert (out / "experiment.json").is_file() and not (out / "summary.csv").exists()
    run_sweep(load_config(None, SMALL + ["naive.batch_size=4"]), out)
    assert len(ResultsDir(out).done_points()) == 6


@pytest.mark.parametrize("bad", [
    "traffic.prompt_len={dist: sharegpt, path: no-such.json}",
    "backend.preset=nope",
    "traffic.arrival=trace",
])
def test_every_check_happens_before_the_first_file_is_written(tmp_path, bad):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0.0,10,3\n0.5,x,4\n")
    out = tmp_path / "results" / "latest"
    with pytest.raises(ConfigError):
        run_sweep(load_config(None, SMALL + [bad, f"traffic.trace_file={trace}"]), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_planning_writes_nothing(tmp_path):
    out = tmp_path / "results" / "latest"
    plan = plan_sweep(load_config(None, SMALL), out)
    assert plan.total == 6 and len(plan.todo) == 6 and plan.link == out and plan.path.parent == out.parent
    assert not (tmp_path / "results").exists()
    execute(plan)
    assert (out / "summary.csv").is_file()


def test_failed_requests_are_reported_as_each_point_finishes(tmp_path):
    oom = ["strategies=[naive]", "traffic.rates=[8]", "backend.preset=toy", "traffic.prompt_len=4000",
           "traffic.output_len=8", "naive.batch_size=16", "traffic.duration_s=6", "traffic.warmup_s=0", "report=false"]
    seen = []
    run_sweep(load_config(None, oom), tmp_path / "r", on_point=seen.append)
    (p,) = seen
    assert p.requests > 0 and p.failed == p.requests and p.error.startswith("out of memory — a batch of 16 padded")
    assert p.summary["failed"] == p.failed and p.summary["num_rows"] == p.requests


# ---- crash safety ------------------------------------------------------------------------------------

TINY = ["strategies=[naive, continuous]", "traffic.rates=[4]", "traffic.duration_s=6", "traffic.warmup_s=1",
        "report=false", "traffic.prompt_len={dist: uniform, low: 4, high: 16}",
        "traffic.output_len={dist: uniform, low: 2, high: 8}"]


class Killed(Exception):
    pass


def _dies_after(n: int):
    real, calls = sweep.run_point, []

    def run_point(*args, **kwargs):
        if len(calls) == n:
            raise Killed
        calls.append(1)
        return real(*args, **kwargs)
    return run_point


def summary_records(path: Path) -> list[list[str]]:
    """summary.csv's records with wall_s blanked: the one figure that is not reproducible."""
    records = list(csv.reader(path.open(newline="")))
    at = records[0].index("wall_s")
    return [r[:at] + [""] + r[at + 1:] if i else r for i, r in enumerate(records)]


def assert_same_files(a: Path, b: Path) -> None:
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    assert summary_records(a / "summary.csv") == summary_records(b / "summary.csv")
    assert (a / "summary.csv").stat().st_size == (b / "summary.csv").stat().st_size or \
        [len(x) for x in (a / "summary.csv").read_bytes().split(b"\r\n")][0] == \
        [len(x) for x in (b / "summary.csv").read_bytes().split(b"\r\n")][0]
    assert (a / "config.yaml").read_text().replace(str(a), "OUT") == (b / "config.yaml").read_text().replace(str(b), "OUT")


def row_starts(data: bytes) -> list[int]:
    out, at = [0], data.find(b"\r\n")
    while at != -1:
        out.append(at + 2)
        at = data.find(b"\r\n", at + 2)
    return out


def test_truncation_anywhere_in_the_last_point_is_detected_and_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    """Cut requests.csv, then summary.csv, at every byte offset inside the last point's rows: the
    scan (the only step that sees the cut) must trust exactly the first point every time; a full
    resume then writes the same bytes as the uninterrupted run. The resume runs at every row
    boundary, one byte either side, and every 211th offset: it starts from the state the scan
    proved identical at every offset."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)     # only a power cut needs it; 7 ms a call here
    cfg = load_config(None, TINY)
    full = run_sweep(cfg, tmp_path / "full")
    first, last = ("naive", 4.0, 0), ("continuous", 4.0, 0)
    intact = ResultsDir(full).scan()
    assert list(intact.points) == [first, last]
    d = tmp_path / "d"
    shutil.copytree(full, d)
    checked = resumed = 0
    for name, skip in (("requests.csv", 1 + len(intact.points[first].rows)), ("summary.csv", 2)):
        data = (full / name).read_bytes()
        starts = row_starts(data)
        start = starts[skip]
        sample = {s + k for s in starts[skip:] for k in (-1, 0, 1)} | set(range(start, len(data), 211))
        for cut in range(len(data) - 1, start - 1, -1):
            # NOTE: written from the original bytes, not truncated in place: a resume in between
            # rewrites the last summary row with its own wall_s, whose length differs, and
            # truncating that file could leave the row whole (or pad it with NUL bytes).
            (d / name).write_bytes(data[:cut])
            scan = ResultsDir(d).scan()
            assert list(scan.points) == [first] and scan.dropped == [last], (name, cut)
            assert scan.points[first] == intact.points[first]
            checked += 1
            if cut in sample:
                seen = []
                run_sweep(cfg, d, on_point=lambda p: seen.append(p.summary["strategy"]))
                assert seen == ["continuous"], (name, cut)
                assert_same_files(full, d)
                resumed += 1
        (d / name).write_bytes(data)
    assert checked > 5000 and resumed > 50


@pytest.mark.parametrize("where", ["in run_point", "in on_point"])
def test_a_sweep_killed_between_points_resumes_to_the_same_bytes(tmp_path, monkeypatch, where):
    cfg = load_config(None, SMALL + ["traffic.rates=[5, 20, 40]", "strategies=[naive, continuous]"])
    full = run_sweep(cfg, tmp_path / "full")
    out = tmp_path / "r"
    if where == "in run_point":
        monkeypatch.setattr(sweep, "run_point", _dies_after(3))
        with pytest.raises(Killed):
            run_sweep(cfg, out)
        monkeypatch.undo()
    else:
        def on_point(p):
            if p.summary["rate"] == 20.0:
                raise Killed
        with pytest.raises(Killed):
            run_sweep(cfg, out, on_point=on_point)
    assert len(ResultsDir(out).done_points()) == 3
    assert yaml.safe_load((out / "config.yaml").read_text())["traffic"]["rates"] == [5, 20]   # what is there
    run_sweep(cfg, out)
    assert_same_files(full, out)


@pytest.mark.parametrize("damage", ["delete a request row", "edit a request value", "delete a summary row",
                                    "cut a request row in two"])
def test_damage_to_an_earlier_point_reruns_it_and_restores_canonical_order(tmp_path, damage):
    cfg = load_config(None, SMALL + ["strategies=[naive, continuous]"])
    full = run_sweep(cfg, tmp_path / "full")
    out = tmp_path / "r"
    shutil.copytree(full, out)
    n_first = len(ResultsDir(full).scan().points["naive", 5.0, 0].rows)
    req = (out / "requests.csv").read_bytes().split(b"\r\n")
    summ = (out / "summary.csv").read_bytes().split(b"\r\n")
    hit = 1 + n_first + 2                                  # a row of the second point (continuous @ 5)
    if damage == "delete a request row":
        del req[hit]
    elif damage == "edit a request value":
        req[hit] = req[hit].replace(b",finished,", b",failed,")
    elif damage == "delete a summary row":
        del summ[2]
    else:
        req[hit:hit + 1] = [req[hit][:25], req[hit][25:]]
    (out / "requests.csv").write_bytes(b"\r\n".join(req))
    (out / "summary.csv").write_bytes(b"\r\n".join(summ))
    seen = []
    run_sweep(cfg, out, on_point=lambda p: seen.append((p.summary["strategy"], p.summary["rate"])))
    assert seen == [("continuous", 5.0)]
    assert_same_files(full, out)
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("content", [None, "not json", '{"a": 1}'])
def test_a_classs_sharegpt_file_is_checked_before_the_first_file_is_written(tmp_path, content):
    share = tmp_path / "share.json"
    if content is not None:
        share.write_text(content)
    classes = ("traffic.classes=[{name: a, weight: 1}, {name: b, weight: 1, "
               f"prompt_len: {{dist: sharegpt, path: '{share}'}}}}]")
    out = tmp_path / "results" / "latest"
    with pytest.raises(ConfigError, match="share.json"):
        run_sweep(load_config(None, SMALL + [classes]), out)
    assert not (tmp_path / "results").exists()
