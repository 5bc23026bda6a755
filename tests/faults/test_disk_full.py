"""A disk that fills while a point is written: the results writer's append writes half its text,
then fails with ENOSPC. The command ends at once in one line naming the file; every point recorded
before stays byte for byte; rerunning (the disk freed) resumes to the bytes of an uninterrupted run."""
from __future__ import annotations

import pytest

from batchlab.run.results import ResultsDir
from tests.faults.conftest import one_error_line, run
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
