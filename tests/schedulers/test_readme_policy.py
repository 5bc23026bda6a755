"""The README's example policy runs as written: by import path from the working directory, on
the simulator through the command line and on the tiny HF model's step engine, unchanged."""
import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME = "my_policy:EarliestDeadlineFirst"


def example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- example:policy -->\n```python\n(.*?)```", text, re.S)
    assert m, "README: the example policy block is gone"
    return m.group(1)


def test_readme_policy_runs_on_the_simulator_from_the_command_line(tmp_path):
    (tmp_path / "my_policy.py").write_text(example())
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "batchlab.cli", "run", str(ROOT / "configs/policies.yaml"), "--quiet",
                        "--out", str(out), "--set", f"strategies=[continuous, {NAME}]", "--set", "traffic.rates=[7]",
                        "--set", "traffic.duration_s=40"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader((out / "requests.csv").open()))
    mine = [r for r in rows if r["strategy"] == NAME]
    fcfs = [r for r in rows if r["strategy"] == "continuous"]
    assert len(mine) == len(fcfs) > 200 and all(r["status"] == "finished" for r in mine)

    def p99_ttft(rs, klass):
        v = sorted(float(r["ttft"]) for r in rs if r["class"] == klass and r["warmup"] == "0")
        return v[int(0.99 * (len(v) - 1))]
    # deadlines of 0.5 s for `interactive` (priority 0) vs 5 s for `batch`: the hooks really reorder
    assert p99_ttft(mine, "interactive") < 0.5 * p99_ttft(fcfs, "interactive")
    assert "my_policy:EarliestDeadlineFirst" in (out / "report.md").read_text()


@pytest.mark.hf
def test_readme_policy_runs_unchanged_on_the_hf_step_engine(tmp_path, monkeypatch):
    from batchlab.backends import make_backend
    from batchlab.run.config import load_config
    from batchlab.run.point import run_point
    (tmp_path / "my_policy.py").write_text(example())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(ROOT / "configs/smoke.yaml", [
        f"strategies=[{NAME}]", "traffic.rates=[20]", "traffic.duration_s=2", "traffic.warmup_s=0",
        "traffic.output_len=8", "traffic.prompt_len=16",
        "traffic.classes=[{name: chat, weight: 3, priority: 0}, {name: batch, weight: 1, priority: 1, output_len: 24}]"])
    res = run_point(cfg, NAME, 20.0, 0, make_backend(cfg))
    assert res.requests and all(r.status.value == "finished" and r.output_len == r.max_new_tokens for r in res.requests)
    assert {r.klass for r in res.requests} == {"chat", "batch"}


def test_the_readme_quotes_what_configs_policies_yaml_reports(tmp_path):
    """The policy lab's quoted verdict and throughputs are what the deterministic simulation prints."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "batchlab.cli", "run", str(ROOT / "configs/policies.yaml"),
                        "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    readme = " ".join((ROOT / "README.md").read_text().split())
    quote = re.search(r"> (priority cut p99 TTFT of class `interactive`[^\n]*?\.)(?= Preemption)", readme)
    assert quote and quote.group(1) in " ".join(p.stdout.split()), "README: paste the policy lab's verdict line"
    summary = {(r["strategy"], float(r["rate"])): r for r in csv.DictReader((out / "summary.csv").open())}
    served = {s: float(summary[s, 7.0]["requests_per_s"]) for s in ("priority", "continuous")}
    assert f"priority served {served['priority']:.2f} req/s there against FCFS's {served['continuous']:.2f}" in readme
    drop = re.search(r"capacity under the run's SLO drops from (\d+) to (\d+) req/s", readme)
    first = p.stdout.splitlines()[0]
    assert drop and f"continuous {drop.group(1)};" in first and f"priority {drop.group(2)} " in first, first
