"""The command line as a user meets it: real subprocesses, exit codes, one-line errors."""
import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def batchlab(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "batchlab.cli", *args], capture_output=True, text=True, cwd=cwd)


ROOT = Path(__file__).resolve().parents[1]


def test_default_run_prints_a_verdict_naming_the_rate(tmp_path):
    p = batchlab("run", "--out", str(tmp_path / "out"), "--quiet", "--set", "traffic.duration_s=20")
    assert p.returncode == 0, p.stderr
    assert "verdict:" in p.stdout
    assert re.search(r"Dynamic batching .* naive batching at [0-9.]+ req/s", " ".join(p.stdout.split()))
    assert (tmp_path / "out" / "requests.csv").is_file() and (tmp_path / "out" / "summary.csv").is_file()
    assert (tmp_path / "out" / "report.html").is_file()


def test_the_default_runs_first_line_is_the_capacity_headline_and_the_readme_quotes_it(tmp_path):
    """`make run` exactly: its first line names each strategy's sustained rate under the SLO, and the
    README shows that line as printed (the simulation is deterministic)."""
    p = batchlab("run", "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    m = re.fullmatch(r"verdict: (\w+) sustains (.+) within TTFT ≤ 1 s and TPOT ≤ 50 ms; (\w+) (\S+); (\w+) (\S+) — .+\.", first)
    assert m and {m.group(1).lower(), m.group(3), m.group(5)} == {"naive", "dynamic", "continuous"}, first
    assert first in (ROOT / "README.md").read_text(), "README: paste the default run's first line"
    assert "sweep done" in p.stderr and "sweep done" not in p.stdout              # progress on stderr


@pytest.mark.parametrize("args,message", [
    (["run", "--set", "traffic.rates=[-5]"], "traffic.rates.0"),
    (["run", "--set", "naive.batch_size=0"], "naive.batch_size"),
    (["run", "--set", "nope=1"], "nope: unknown key"),
    (["run", "--set", "naive.batch_size=many"], "naive.batch_size"),
    (["run", "missing.yaml"], "config file not found"),
    (["report", "no-such-dir"], "no summary.csv"),
    (["run", "--set", "strategies=[continuous, no_such_pkg.policies:Mine]"], "no module named 'no_such_pkg'"),
    (["run", "--set", "strategies=[fifo_deluxe]"], "unknown strategy 'fifo_deluxe'"),
    (["run", "--set", "strategies=['not a name']"], "strategies.0"),
    (["run", "--set", "traffic.classes=[{name: a}]"], "give exactly one of weight"),
    (["run", "--set", "traffic.classes=[{name: a, rate: 3}]"], "at least one class needs a weight"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    p = batchlab(*args, "--out", str(tmp_path / "out")) if args[0] == "run" else batchlab(*args)
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def files_under(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("where,message", [
    ("a-file", "is a file, not a directory"),
    ("a-file/sub", "a-file is a file, not a directory"),
    ("READONLY", "cannot write in"),
    ("READONLY/new/deeper", "cannot write in"),
])
def test_an_unusable_out_is_one_line_exit_2_and_creates_nothing(tmp_path, where, message, unwritable_dir):
    (tmp_path / "a-file").write_text("not a directory")
    ro = unwritable_dir
    out = where.replace("READONLY", str(ro)) if where.startswith("READONLY") else str(tmp_path / where)
    before = files_under(tmp_path)
    p = batchlab("run", "--out", out, "--quiet", "--set", "traffic.duration_s=5")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith("error: output directory") and message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("summary", [None, "strategy,rate\n", "strategy,rate,repeat,point_hash,num_requests\n"])
def test_report_refuses_a_directory_that_holds_no_results(tmp_path, summary):
    if summary is not None:
        (tmp_path / "summary.csv").write_text(summary)
    before = files_under(tmp_path)
    p = batchlab("report", str(tmp_path))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "not a batchlab results directory" in p.stderr and "Traceback" not in p.stderr
    assert files_under(tmp_path) == before


SMALL = ["--set", "traffic.duration_s=6", "--set", "traffic.warmup_s=1", "--set", "traffic.rates=[5, 20]",
         "--set", "strategies=[naive, continuous]", "--set", "report=false"]


def test_report_on_a_killed_runs_directory_leaves_the_torn_point_out(tmp_path):
    out = tmp_path / "r"
    assert batchlab("run", "--out", str(out), "--quiet", *SMALL).returncode == 0
    data = (out / "requests.csv").read_bytes()
    (out / "requests.csv").write_bytes(data[:-300])             # killed inside the last point's rows
    p = batchlab("report", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith("warning: continuous @ 20 req/s (repeat 0) was incomplete")
    assert (out / "report.md").is_file()
    assert "continuous @ 20 req/s repeat 0" in (out / "config.yaml").read_text()   # the config tells the truth
    p = batchlab("run", "--out", str(out), "--quiet", *SMALL)      # the same command completes it
    assert p.returncode == 0 and (out / "requests.csv").read_bytes() == data


def test_failed_requests_show_while_the_sweep_runs(tmp_path):
    oom = ["--set", "strategies=[naive]", "--set", "traffic.rates=[8]", "--set", "backend.preset=toy",
           "--set", "traffic.prompt_len=4000", "--set", "traffic.output_len=8", "--set", "naive.batch_size=16",
           "--set", "traffic.duration_s=6", "--set", "traffic.warmup_s=0", "--set", "report=false"]
    p = batchlab("run", "--out", str(tmp_path / "r"), *oom)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    assert re.fullmatch(r"warning: naive @ 8 req/s \(repeat 0\): (\d+) of \1 requests failed \(out of memory — "
                        r"a batch of 16 padded to [0-9,]+ tokens needs [0-9,]+ KV tokens, budget [0-9,]+\)", lines[0])
    assert re.search(r"1/1 +(\d+) failed", p.stderr)             # the progress bar's running count
    p = batchlab("run", "--out", str(tmp_path / "q"), "--quiet", *oom)
    assert "requests failed (out of memory — a batch of 16" in p.stderr          # --quiet hides the bar, not the failures


def test_the_readme_sequence_keeps_two_experiments_apart(tmp_path):
    """`make run`, then the README's --set example: results/latest follows the newest experiment
    and the first one's directory is left exactly as it was."""
    fast = ["--set", "traffic.duration_s=10", "--set", "traffic.warmup_s=2", "--set", "report=false"]
    assert batchlab("run", "--quiet", *fast, cwd=tmp_path).returncode == 0
    latest = tmp_path / "results" / "latest"
    first = latest.resolve()
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    p = batchlab("run", "--quiet", *fast, "--set", "traffic.rates=[2,8,32]", "--set", "dynamic.max_wait_ms=20", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    second = latest.resolve()
    assert second != first and {p.name: p.read_bytes() for p in first.iterdir()} == before
    assert {r["rate"] for r in csv.DictReader((latest / "summary.csv").open())} == {"2.0", "8.0", "32.0"}
    assert "max_wait_ms: 20.0" in (latest / "config.yaml").read_text()
    assert batchlab("report", "results/latest", cwd=tmp_path).returncode == 0
    assert (second / "report.md").is_file() and not (first / "report.md").exists()


def test_a_machine_error_mid_run_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """Disk full (ENOSPC) while a point is written: one error line, exit 1, and the command can resume."""
    import errno

    from click.testing import CliRunner

    from batchlab.cli import main
    from batchlab.run import results

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(results, "append_synced", full)
    res = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r"), "--quiet", "--set", "traffic.rates=[5]",
                                    "--set", "traffic.duration_s=5", "--set", "report=false"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "error: No space left on device" in res.output and "resume" in res.output


def test_the_recorded_config_is_the_config_that_ran_and_reruns_from_anywhere(tmp_path):
    """config.yaml names the real output directory (not the config's `out`) and absolute input
    paths, so running it again from another directory resumes the same experiment."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "data").mkdir(parents=True)
    elsewhere.mkdir()
    (work / "data" / "t.csv").write_text("arrival_time,prompt_len,output_len\n0.0,32,8\n0.5,40,8\n1.0,50,8\n1.7,30,8\n")
    trace = ["--set", "traffic.arrival=trace", "--set", "traffic.trace_file=data/t.csv", "--set", "traffic.warmup_s=0",
             "--set", "report=false", "--set", "out=results/burst"]
    assert batchlab("run", "--quiet", "--out", "res/x", *trace, cwd=work).returncode == 0
    recorded = yaml.safe_load((work / "res" / "x" / "config.yaml").read_text())
    assert recorded["out"] == str((work / "res" / "x").resolve())
    assert recorded["traffic"]["trace_file"] == str((work / "data" / "t.csv").resolve())
    before = (work / "res" / "x" / "summary.csv").read_bytes()
    p = batchlab("run", "--quiet", str(work / "res" / "x" / "config.yaml"), cwd=elsewhere)
    assert p.returncode == 0, p.stderr
    assert (work / "res" / "x" / "summary.csv").read_bytes() == before and not list(elsewhere.iterdir())
