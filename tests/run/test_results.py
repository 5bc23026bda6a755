"""The results directory on its own: experiment identity, the ledger that finds torn and
incomplete points, atomic rewrites, and the output-location checks. Built from hand-made rows."""
import os
import sys
from pathlib import Path

import pytest
import yaml

from batchlab.errors import ConfigError
from batchlab.run.config import load_config
from batchlab.run.experiment import differences, digest, identity
from batchlab.run.results import ResultsDir, check_location, recorded_config
from batchlab.run.schema import REQUEST_COLUMNS


def rows(strategy: str, rate: float, n: int, error: str = "") -> list[dict]:
    return [{c: "" for c in REQUEST_COLUMNS} | {"request_id": f"{strategy}-{rate}-{i}", "strategy": strategy,
                                                  "rate": rate, "repeat": 0, "status": "finished",
                                                  "error": error, "e2e": repr(0.5 + i)} for i in range(n)]


def summary(strategy: str, rate: float) -> dict:
    return {"strategy": strategy, "rate": rate, "repeat": 0, "point_hash": "h", "num_requests": 3, "wall_s": 0.1}


def two_points(tmp_path: Path, error: str = "") -> ResultsDir:
    d = ResultsDir(tmp_path / "r")
    with d.writing():
        d.append_point(rows("naive", 5.0, 3, error), summary("naive", 5.0))
        d.append_point(rows("dynamic", 5.0, 2, error), summary("dynamic", 5.0))
    return d


# ---- identity --------------------------------------------------------------------------------------

def test_identity_ignores_what_may_grow_and_what_changes_no_result():
    base = identity(load_config(None, []))
    same = identity(load_config(None, ["traffic.rates=[1, 2]", "traffic.repeats=3", "strategies=[naive]",
                                         "name=x", "out=elsewhere", "report=false", "backend.api_key_env=MY_KEY"]))
    assert same == base and digest(same) == digest(base)
    assert "sk-secret" not in str(base) and "rates" not in base["traffic"]
    for change in ["dynamic.max_wait_ms=20", "traffic.seed=1", "traffic.duration_s=30", "slo.ttft_s=2",
                   "backend.preset=toy", "continuous.block_size=32"]:
        assert digest(identity(load_config(None, [change]))) != digest(base), change


def test_an_edited_input_file_is_another_experiment(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0.0,10,3\n")
    cfg = load_config(None, ["traffic.arrival=trace", f"traffic.trace_file={trace}"])
    before = identity(cfg)
    trace.write_text("arrival_time,prompt_len,output_len\n0.0,10,4\n")
    after = identity(cfg)
    assert before != after
    assert "input_files.traffic.trace_file" in differences(before, after)


def test_differences_name_each_key_with_both_values():
    a = identity(load_config(None, []))
    b = identity(load_config(None, ["dynamic.max_wait_ms=20", "traffic.seed=7"]))
    assert differences(a, b) == "dynamic.max_wait_ms: 50.0 there, 20.0 now; traffic.seed: 0 there, 7 now"
    many = identity(load_config(None, [f"continuous.{k}" for k in
                                         ["max_num_seqs=3", "block_size=8", "chunk_size=4", "max_num_batched_tokens=9",
                                          "num_kv_blocks=5"]]))
    assert differences(a, many).endswith("; and 1 more")


def test_config_yaml_tells_what_is_recorded_and_keeps_no_secret(tmp_path):
    tree = load_config(None, []).model_dump(mode="json")
    tree["backend"]["api_key"] = "sk-secret"          # a tree from an older batchlab: the key must not be copied
    keys = [("naive", 5.0, 0), ("dynamic", 5.0, 0), ("naive", 20.0, 0), ("naive", 20.0, 1)]
    text = recorded_config(tree, keys, "abc", tmp_path)
    cfg = yaml.safe_load(text)
    assert cfg["strategies"] == ["naive", "dynamic"] and cfg["traffic"]["rates"] == [5.0, 20.0]
    assert cfg["traffic"]["repeats"] == 2 and cfg["out"] == str(tmp_path)
    assert "sk-secret" not in text and "api_key" not in cfg["backend"]
    assert ("# Not recorded: naive @ 5 req/s repeat 1, dynamic @ 5 req/s repeat 1, dynamic @ 20 req/s repeat 0, "
            "dynamic @ 20 req/s repeat 1\n") in text


# ---- the ledger --------------------------------------------------------------------------------------

def test_appended_points_are_found_intact_with_their_rows(tmp_path):
    d = two_points(tmp_path)
    scan = d.scan()
    assert scan.clean and scan.dropped == []
    assert list(scan.points) == [("naive", 5.0, 0), ("dynamic", 5.0, 0)]
    assert [len(p.rows) for p in scan.points.values()] == [3, 2]
    header = scan.header
    assert header[-2:] == ["num_rows", "rows_digest"]
    assert scan.points["naive", 5.0, 0].summary.fields[header.index("num_rows")] == "3"


def test_points_an_older_batchlab_wrote_are_kept_and_carried_to_today_s_columns(tmp_path, monkeypatch):
    """requests.csv from before columns were added at its end: its points are verified as written,
    then rewritten with the new columns empty, byte for byte otherwise; none is dropped or rerun."""
    import batchlab.run.ledger as ledger
    old = REQUEST_COLUMNS[:-3]
    monkeypatch.setattr(ledger, "REQUEST_COLUMNS", old)       # write as the older version did
    monkeypatch.setattr("batchlab.run.results.REQUEST_COLUMNS", old)
    d = two_points(tmp_path)
    before = d.requests_csv.read_text()
    monkeypatch.undo()
    scan = d.scan()
    assert not scan.clean and scan.dropped == [] and len(scan.points) == 2
    with d.writing():
        d.repair(scan)
    after = d.requests_csv.read_text()
    assert after.splitlines()[0].split(",") == REQUEST_COLUMNS
    assert [line + ",,," for line in before.splitlines()[1:]] == after.splitlines()[1:]
    again = d.scan()
    assert again.clean and [len(p.rows) for p in again.points.values()] == [3, 2]


@pytest.mark.parametrize("damage", ["delete a row", "edit a value", "glue a torn row", "duplicate a row"])
def test_damaged_request_rows_drop_their_point_only(tmp_path, damage):
    d = two_points(tmp_path)
    lines = d.requests_csv.read_bytes().split(b"\r\n")        # header, 3 naive rows, 2 dynamic rows, ''
    if damage == "delete a row":
        del lines[2]
    elif damage == "edit a value":
        lines[2] = lines[2].replace(b"1.5", b"1.6")
    elif damage == "glue a torn row":
        lines[2] = lines[2][:40] + lines[3]
        del lines[3]
    else:
        lines.insert(2, lines[2])
    d.requests_csv.write_bytes(b"\r\n".join(lines))
    scan = d.scan()
    assert not scan.clean and scan.dropped == [("naive", 5.0, 0)] and list(scan.points) == [("dynamic", 5.0, 0)]


def test_a_torn_header_or_a_garbage_summary_trusts_nothing(tmp_path):
    d = two_points(tmp_path)
    d.requests_csv.write_bytes(d.requests_csv.read_bytes()[:30])
    scan = d.scan()
    assert scan.points == {} and set(scan.dropped) == {("naive", 5.0, 0), ("dynamic", 5.0, 0)}
    d = two_points(tmp_path / "b")
    d.summary_csv.write_text("what,is,this\r\n1,2,3\r\n")
    assert d.scan().points == {} and not d.scan().clean


def test_a_quote_left_open_at_the_end_is_a_torn_row(tmp_path):
    d = two_points(tmp_path, error="line one\r\nline two, with a comma")
    text = d.requests_csv.read_bytes()
    cut = text.rindex(b"line one\r\n") + len(b"line one\r\n")   # ends in a line end, but inside quotes
    d.requests_csv.write_bytes(text[:cut])
    scan = d.scan()
    assert list(scan.points) == [("naive", 5.0, 0)] and scan.dropped == [("dynamic", 5.0, 0)]


def test_repair_rewrites_only_the_intact_points_in_canonical_order(tmp_path):
    d = ResultsDir(tmp_path / "r")
    with d.writing():
        d.append_point(rows("dynamic", 5.0, 2), summary("dynamic", 5.0))
        d.append_point(rows("naive", 20.0, 1), summary("naive", 20.0))
        d.append_point(rows("naive", 5.0, 3), summary("naive", 5.0))      # belongs first
        d.requests_csv.write_bytes(d.requests_csv.read_bytes()[:-5])      # and is torn
        assert d.repair(d.scan()) == [("naive", 5.0, 0)]
        assert list(d.scan().points) == [("dynamic", 5.0, 0), ("naive", 20.0, 0)] and d.scan().clean
        d.append_point(rows("naive", 5.0, 3), summary("naive", 5.0))
        assert not d.scan().in_order
        d.put_in_order()
    scan = d.scan()
    assert scan.clean and list(scan.points) == [("naive", 5.0, 0), ("dynamic", 5.0, 0), ("naive", 20.0, 0)]
    assert not list(d.path.glob(".*.tmp"))


def test_a_new_summary_column_widens_the_header_instead_of_being_dropped(tmp_path):
    d = ResultsDir(tmp_path / "r")
    with d.writing():
        d.append_point(rows("naive", 5.0, 1), summary("naive", 5.0))
        d.append_point(rows("dynamic", 5.0, 1), summary("dynamic", 5.0) | {"oom_batches": 4})
    scan = d.scan()
    assert scan.clean and scan.header[-1] == "oom_batches"
    assert scan.points["dynamic", 5.0, 0].summary.fields[-1] == "4" and scan.points["naive", 5.0, 0].summary.fields[-1] == ""


def test_a_second_writer_is_refused(tmp_path):
    if sys.platform == "win32":
        pytest.skip("no lock on Windows")
    d = ResultsDir(tmp_path / "r")
    with d.writing():
        assert d.busy()
        with pytest.raises(ConfigError, match="another batchlab process is writing here"):
            with ResultsDir(tmp_path / "r").writing():
                pass
    assert not d.busy()


def test_write_text_is_atomic_and_skips_identical_content(tmp_path):
    d = ResultsDir(tmp_path)
    p = tmp_path / "config.yaml"
    d.write_text(p, "a: 1\n")
    inode = p.stat().st_ino
    d.write_text(p, "a: 1\n")
    assert p.stat().st_ino == inode                    # unchanged: not rewritten
    d.write_text(p, "a: 2\n")
    assert p.read_text() == "a: 2\n" and p.stat().st_ino != inode and not list(tmp_path.glob(".*.tmp"))


# ---- where results may go ----------------------------------------------------------------------------

def test_output_location_checks(tmp_path, unwritable_dir):
    f = tmp_path / "file"
    f.write_text("x")
    ro = unwritable_dir
    cases = {f: "is a file, not a directory", f / "sub": f"{f} is a file, not a directory",
             ro: f"cannot write in {ro}", ro / "new" / "deeper": f"cannot write in {ro}"}
    for path, message in cases.items():
        with pytest.raises(ConfigError, match="output directory") as e:
            check_location(path)
        assert message in str(e.value)
    check_location(tmp_path / "fresh" / "deeper")            # can be made: fine
    assert not (tmp_path / "fresh").exists() and sorted(os.listdir(tmp_path)) == sorted(
        ["file"] + (["ro"] if ro.parent == tmp_path else []))


def test_tidy_drops_incomplete_points_for_a_reader_and_refuses_what_is_not_results(tmp_path):
    d = two_points(tmp_path)
    d.claim({"some": "experiment"})
    (d.path / "config.yaml").write_text(yaml.safe_dump({"strategies": ["naive", "dynamic"], "traffic": {"rates": [5.0]}}))
    d.requests_csv.write_bytes(d.requests_csv.read_bytes()[:-3])
    assert d.tidy() == [("dynamic", 5.0, 0)]
    assert list(d.scan().points) == [("naive", 5.0, 0)] and d.scan().clean
    assert yaml.safe_load((d.path / "config.yaml").read_text())["strategies"] == ["naive"]
    assert d.tidy() == []                                           # nothing more to drop
    d.experiment_json.unlink()                                      # an older batchlab's directory: read as is
    assert d.tidy() == []
    d.summary_csv.write_text("strategy,rate\r\n")
    with pytest.raises(ConfigError, match="not a batchlab results directory"):
        d.tidy()
    with pytest.raises(ConfigError, match="no such directory"):
        ResultsDir(tmp_path / "nothing").tidy()
