"""`batchlab report` on a results directory whose files were changed after they were written.

It says what it found, a point whose rows no longer match the digest its summary row records
(edited or corrupted) or a point without its summary row (incomplete), and blames no kill it
cannot know about. With no intact point left it refuses in one line and changes no file.
"""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from batchlab.cli import main

SWEEP = ["run", "--quiet", "--set", "strategies=[naive, dynamic, continuous]", "--set", "traffic.rates=[4]",
         "--set", "traffic.duration_s=6", "--set", "traffic.warmup_s=1", "--set", "report=false"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("recorded") / "r"
    assert CliRunner().invoke(main, [*SWEEP, "--out", str(out)]).exit_code == 0
    return out


def copy(recorded, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(recorded, out)
    return out


def flip_a_byte(path, row: int) -> None:
    """Change one digit in the `row`-th record (1: the first after the header)."""
    data = bytearray(path.read_bytes())
    start = [i for i, b in enumerate(data) if b == ord("\n")][row - 1] + 1
    at = next(i for i in range(start + 40, len(data)) if chr(data[i]).isdigit())
    data[at] = ord("7") if data[at] != ord("7") else ord("3")
    path.write_bytes(bytes(data))


def report(out) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["report", str(out)])
    return res.exit_code, res.output


def test_each_point_left_out_is_named_with_what_was_found_and_no_kill_is_blamed(recorded, tmp_path):
    out = copy(recorded, tmp_path)
    flip_a_byte(out / "requests.csv", 2)                         # a row of the first point (naive)
    summary = (out / "summary.csv").read_bytes().split(b"\r\n")
    (out / "summary.csv").write_bytes(b"\r\n".join(summary[:3] + [b""]))   # the continuous point's row is gone
    status, output = report(out)
    assert status == 0, output
    flipped = next(line for line in output.splitlines() if "naive @ 4" in line)
    assert "changed after it was written" in flipped and "do not match the digest" in flipped and "left out" in flipped
    cut = next(line for line in output.splitlines() if "continuous @ 4" in line)
    assert "incomplete" in cut and "no summary row" in cut and "left out" in cut
    assert "killed" not in output and (out / "report.md").is_file()


def test_with_no_intact_point_left_report_refuses_in_one_line_and_changes_no_file(recorded, tmp_path):
    out = copy(recorded, tmp_path)
    rows = len((out / "requests.csv").read_bytes().split(b"\n")) - 1
    for row in (2, rows // 2, rows - 1):                       # one in each point
        flip_a_byte(out / "requests.csv", row)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    status, output = report(out)
    assert status == 2 and output.startswith("error: ") and len(output.strip().splitlines()) == 1, output
    assert "no intact point" in output and "killed" not in output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
