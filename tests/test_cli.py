"""The command line as a user meets it: real subprocesses, exit codes, one-line errors."""
import re
import subprocess
import sys

import pytest


def batchlab(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "batchlab.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_default_run_prints_a_verdict_naming_the_rate(tmp_path):
    p = batchlab("run", "--out", str(tmp_path / "out"), "--quiet", "--set", "traffic.duration_s=20")
    assert p.returncode == 0, p.stderr
    assert "verdict:" in p.stdout
    assert re.search(r"Dynamic batching .* naive batching at [0-9.]+ req/s", " ".join(p.stdout.split()))
    assert (tmp_path / "out" / "requests.csv").is_file() and (tmp_path / "out" / "summary.csv").is_file()


@pytest.mark.parametrize("args,message", [
    (["run", "--set", "traffic.rates=[-5]"], "traffic.rates.0"),
    (["run", "--set", "naive.batch_size=0"], "naive.batch_size"),
    (["run", "--set", "nope=1"], "nope: unknown key"),
    (["run", "--set", "naive.batch_size=many"], "naive.batch_size"),
    (["run", "missing.yaml"], "config file not found"),
    (["report", "no-such-dir"], "no summary.csv"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    p = batchlab(*args, "--out", str(tmp_path / "out")) if args[0] == "run" else batchlab(*args)
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
