"""A disk that fills while a point is written: the results writer's append writes half its text,
then fails with ENOSPC. The command ends at once in one line naming the file; every point recorded
before stays byte for byte; rerunning (the disk freed) resumes to the bytes of an uninterrupted run.
The same for every file written whole (experiment.json, setup.json, the report, a search's or a
profile's JSON): the previous file stays as it was and no temp file is left behind."""
from __future__ import annotations

import pytest

from batchlab.run.results import ResultsDir
from tests.faults.conftest import last_error_line, one_error_line, run
from tests.run.test_sweep import assert_same_files

SWEEP = ["run", "--quiet", "--set", "strategies=[naive, continuous]", "--set", "traffic.rates=[4, 8]",
         "--set", "traffic.duration_s=10", "--set", "traffic.warmup_s=1", "--set", "report=false"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "r"
    assert run(*SWEEP, "--out", str(out))[0] == 0
    return out


# appends: point 1 = its request rows, the summary header, its summary row; each later point = 2
@pytest.mark.parametrize("appends,where", [(3, "requests.csv"), (4, "summary.csv"), (7, "requests.csv")])
def test_a_disk_that_fills_mid_point_harms_nothing_recorded_and_the_rerun_resumes(tmp_path, reference, appends, where):
    out = tmp_path / "r"
    status, stdout, err = run(*SWEEP, "--out", str(out), fault=f"enospc-after-{appends}")
    line = one_error_line(err)
    assert status == 1 and line.startswith(f"error: No space left on device ({out / where})")
    assert "rerun the same command" in line and "a sweep resumes where it stopped" in line
    kept, full = ResultsDir(out).scan().points, ResultsDir(reference).scan().points
    assert kept and all(kept[k].rows == full[k].rows and kept[k].summary.fields[:3] == full[k].summary.fields[:3]
                        for k in kept)
    assert run(*SWEEP, "--out", str(out))[0] == 0
    assert_same_files(reference, out)


def no_temp_files(out) -> bool:
    return not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


# the files a sweep writes whole (atomically), in the order it writes them: a full disk on any of them
@pytest.mark.parametrize("name", ["experiment.json", "setup.json", "report.md", "report.html"])
def test_a_disk_full_on_a_file_written_whole_is_one_line_and_the_rerun_finishes(tmp_path, reference, name):
    out = tmp_path / "r"
    report = ["--set", f"report={str(name.startswith('report')).lower()}"]
    status, _, err = run(*SWEEP, *report, "--out", str(out), fault=f"enospc-writing-{name}")
    assert status == 1 and one_error_line(err).startswith(f"error: No space left on device ({out / name})")
    assert no_temp_files(out) and not (out / name).exists()
    kept, full = ResultsDir(out).scan().points, ResultsDir(reference).scan().points
    assert all(kept[k].rows == full[k].rows for k in kept)
    assert run(*SWEEP, *report, "--out", str(out))[0] == 0
    assert (out / "requests.csv").read_bytes() == (reference / "requests.csv").read_bytes()   # report= is in config.yaml
    assert no_temp_files(out) and (out / name).is_file()


SEARCHES = {
    "tune.json": ["tune", "--slo", "ttft_p99=1s", "--set", "traffic.rates=[10]", "--set", "backend.preset=toy",
                  "--set", "traffic.duration_s=10", "--max-cap", "64"],
    "capacity.json": ["capacity", "--set", "strategies=[continuous]", "--set", "traffic.duration_s=10",
                      "--set", "traffic.warmup_s=1", "--set", "traffic.rates=[2, 16]"],
    "p.json": ["profile", "--preset", "toy"],
}


@pytest.mark.parametrize("name", list(SEARCHES))
def test_a_disk_full_on_a_result_file_keeps_the_previous_one_in_one_line(tmp_path, name):
    written = tmp_path / name
    written.write_text('{"a previous result": true}\n')
    out = ["--out", str(written if name == "p.json" else tmp_path)]
    status, _, err = run(*SEARCHES[name], *out, fault=f"enospc-writing-{name}")
    assert status == 1 and f"No space left on device ({written})" in last_error_line(err)
    assert written.read_text() == '{"a previous result": true}\n' and no_temp_files(tmp_path)
