import csv

import pytest

from batchlab.core.config import load_config
from batchlab.errors import ConfigError
from batchlab.run.results import REQUEST_COLUMNS, ResultsDir
from batchlab.run.sweep import run_sweep

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
    run_sweep(load_config(None, SMALL), out, on_point=seen.append)
    assert seen == [] and (out / "requests.csv").read_bytes() == before
    run_sweep(load_config(None, SMALL + ["traffic.rates=[5, 20, 40]"]), out, on_point=seen.append)
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

    from batchlab.run.results import _fmt
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
