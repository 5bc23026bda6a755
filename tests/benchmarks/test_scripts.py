"""Every name a benchmark script imports from the package exists (read from its source, not by
running it), the serving script starts, and bad input to the scripts with checked flags is one error
line, exit status 2, nothing written. What the scripts compute is tested on the package modules
they call; scripts only ever run here as subprocesses."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def package_imports(script: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every `import batchlab...` and `from batchlab... import name` in a script."""
    out = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("batchlab"):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("batchlab")]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_what_each_script_imports_from_the_package_exists(script):
    if any(m.startswith(("batchlab.backends.hf", "batchlab.baselines.decode_step")) for m, _ in package_imports(script)):
        pytest.importorskip("transformers")
    for module, name in package_imports(script):
        mod = importlib.import_module(module)
        assert name is None or hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), f"{module}.{name}"


def test_the_serving_script_answers_help():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.startswith("usage:") and "--max-points" in res.stdout, res.stderr


@pytest.mark.parametrize("script, args, says", [
    ("serving.py", ["--duration", "0"], "traffic.duration_s"),
    ("serving.py", ["--bracket", "fast"], "--bracket: want LO,HI"),
    ("client_vs_vllm_bench.py", ["--venv", "/nonexistent"], "no vLLM environment"),
    ("policies.py", ["--only-hf"], "--only-hf needs --json"),
    ("twin.py", ["--parts", "profile,nap"], "--parts: unknown nap"),
    ("twin.py", ["--bracket", "fast"], "--bracket: want LO,HI"),
    ("twin.py", ["--parts", "contention", "--condition", "busy"], "run it with --condition quiet"),
    ("twin.py", ["--predict-only", "--out", "/nonexistent/twin"], "no twin at /nonexistent/twin/twin.yaml"),
    ("corrections.py", ["old=/nonexistent/validate"], "old: /nonexistent/validate is not a finished validation"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, script, args, says):
    out = tmp_path / "result.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and says in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and not out.exists()


def test_corrections_keeps_the_coverage_an_earlier_interval_rule_gave_beside_the_new(tmp_path):
    """A record at --json whose intervals were built by another rule keeps its coverage (every
    correction on, per directory) beside the new one; run again under the same rule, nothing doubles."""
    from batchlab.backends.presets import load_cost
    from batchlab.calibrate.validate import INTERVAL, validate
    from batchlab.run.config import load_config
    profile = tmp_path / "toy.json"
    load_cost("toy").to_json(profile, level="any", fit_rms_rel_error=0.05)
    cfg = load_config(None, ["backend.preset=toy", "traffic.rates=[5]", "traffic.duration_s=4", "traffic.warmup_s=1",
                             "traffic.prompt_len=32", "traffic.output_len=8", "strategies=[continuous]",
                             "validation.workloads={long: {prompt_len: 96}}"])
    validate(cfg, [str(profile)], tmp_path / "v")
    out = tmp_path / "corrections.json"
    on = {"drift": True, "live": True, "first_token": True}
    out.write_text(json.dumps({"command": "earlier", "conditions": {"toy": {"variants": [{"on": on, "coverage": 0.5}]}}}))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "corrections.py"), f"toy={tmp_path / 'v'}", "--json", str(out)]
    for _ in range(2):
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr
        rec = json.loads(out.read_text())
        assert rec["conditions"]["toy"]["interval"] == INTERVAL
        assert [(e["command"], e["coverage"]) for e in rec["earlier_intervals"]] == [("earlier", {"toy": 0.5})]
        assert "spread" in rec["earlier_intervals"][0]["interval"]
