import shutil

import pytest
from click.testing import CliRunner

from batchlab.report.compare_cmd import compare_cmd
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

TINY = ["traffic.duration_s=10", "traffic.warmup_s=2", "strategies=[dynamic, continuous]", "report=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    before = run_sweep(load_user_config(None, TINY + ["traffic.rates=[5, 20]"]), root / "before")
    after = run_sweep(load_user_config(None, TINY + ["traffic.rates=[5, 20, 40]", "dynamic.max_wait_ms=5"]),
                      root / "after")
    return root, before, after


def test_two_experiments_side_by_side_at_their_common_rates(runs):
    root, before, after = runs
    res = CliRunner().invoke(compare_cmd, [str(before), str(after), "--out", str(root / "out")])
    assert res.exit_code == 0, res.output
    assert "dynamic @ after against dynamic @ before" in res.output
    md = (root / "out" / "compare.md").read_text()
    assert "| dynamic.max_wait_ms | `50.0` | `5.0` |" in md and "| out |" not in md
    assert "### 5 req/s" in md and "### 20 req/s" in md and "### 40 req/s" not in md     # common rates only
    assert "### continuous @ after vs continuous @ before" in md
    assert (root / "out" / "tradeoff.png").stat().st_size > 10_000 and (root / "out" / "compare.html").is_file()


def test_an_experiment_against_its_copy_changes_nothing(runs, tmp_path):
    root, before, _ = runs
    copy = tmp_path / "copy"
    shutil.copytree(before, copy)
    res = CliRunner().invoke(compare_cmd, [str(before), str(copy), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "✓" not in res.output and "+0%" in res.output
    assert not any(c in res.output for c in ("+1%", "−1%"))


@pytest.mark.parametrize("case, needle", [
    ("one", "two or more"),
    ("traffic", "different traffic"),
    ("no common rate", "share no rate"),
    ("out is an input", "is one of the experiments"),
])
def test_what_cannot_be_compared_is_one_line_and_exit_2(runs, tmp_path, case, needle):
    root, before, after = runs
    other = None
    if case in ("traffic", "no common rate"):       # another seed: other arrivals; or a rate the other never ran
        sets = ["traffic.rates=[5]", "traffic.seed=7"] if case == "traffic" else ["traffic.rates=[9]"]
        other = run_sweep(load_user_config(None, TINY + sets), tmp_path / "other")
    args = {"one": [str(before)], "traffic": [str(before), str(other)], "no common rate": [str(before), str(other)],
            "out is an input": [str(before), str(after), "--out", str(after)]}[case]
    res = CliRunner().invoke(compare_cmd, args + ([] if "--out" in args else ["--out", str(tmp_path / "out")]))
    assert res.exit_code == 2 and needle in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
