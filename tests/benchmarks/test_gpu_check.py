"""benchmarks/gpu_check.sh fits the device tool's limits (it runs only where a GPU is lent, so its
arithmetic and its ratio stage are checked here), and benchmarks/gpu_check.py's ratios stage works."""
import json
import re
import subprocess
import sys
from pathlib import Path

from batchlab.backends.presets import load_cost

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
TOOL_COMMAND_LIMIT_S = 600          # the device tool's limit for one command
KILL_AFTER_S = 5                    # `timeout --kill-after` grace per stage


def budgets() -> dict[str, int]:
    text = SCRIPT.read_text()
    block = re.search(r"declare -A BUDGET=\((.*?)\)\n", text, re.S).group(1)
    return {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", block)}


def test_the_script_parses_and_its_stage_budgets_fit_nine_minutes_and_the_tools_ten():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    b = budgets()
    text = SCRIPT.read_text()
    stages = re.search(r'STAGES=\$\{GPU_CHECK_STAGES:-(.*?)\}', text).group(1).split()
    assert set(stages) == set(b) and all(f"stage {s} " in text for s in stages)   # every stage runs, under a budget
    total = int(re.search(r"BUDGET_TOTAL=(\d+)", text).group(1))
    assert sum(b.values()) <= total <= 540
    assert sum(b.values()) + KILL_AFTER_S * len(b) + 30 < TOOL_COMMAND_LIMIT_S        # 30 s: start-up and packing
    for stage, seconds in b.items():                                                  # each budget is in the header
        assert re.search(rf"#\s+{re.escape(stage)}\s+{seconds}\s", text), stage


def test_the_ratios_stage_compares_the_h200_roofline_with_a_profile(tmp_path):
    est = load_cost("mistral-7b-h200")
    prof = tmp_path / "profile-iteration.json"
    est.to_json(prof, level="iteration", rms_rel_error=0.05)
    out = tmp_path / "ratios.json"
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "ratios", "--out", str(out), str(prof)],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["preset"] == "mistral-7b-h200" and data["preset_kind"] == "roofline estimate"
    terms = data["profiles"]["profile-iteration.json"]["terms"]
    assert terms["kv_s_per_token"]["ratio"] == 1.0 and terms["prefill_step_s"]["ratio"] is None
    assert "measured/estimate 1.00x" in res.stdout
