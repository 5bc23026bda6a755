"""The capacity search: brackets the highest sustained rate within its tolerance, agrees with the
report's rule on a sweep at the rates it found, sees a growing queue that a TPOT-only SLO cannot,
gives the same answer on Ray, and refuses what it cannot search in one line."""
import json

import pytest
from click.testing import CliRunner

from batchlab.core.config import ExecutorConfig
from batchlab.report.capacity import capacities
from batchlab.report.load import load_requests, load_results
from batchlab.run.config import load_user_config
from batchlab.run.executors import RayExecutor
from batchlab.run.sweep import run_sweep
from batchlab.tune.capacity import check_plan, search
from batchlab.tune.capacity_cmd import capacity_cmd

SHORT = ["traffic.duration_s=30", "report=false"]


def found(overrides, strategies, executor=None, width=1, tolerance=0.02, low=2.0, high=80.0):
    cfg = load_user_config(None, SHORT + overrides)
    plan = check_plan(cfg, strategies, low, high, tolerance, width)
    return {f.strategy: f for f in search(plan, executor)}, cfg


def test_the_bracket_is_within_tolerance_and_the_report_agrees_at_its_ends(tmp_path):
    res, cfg = found([], ["dynamic", "continuous"])
    for f in res.values():
        assert f.lo is not None and f.hi is not None and f.hi / f.lo - 1 <= 0.02
        assert all(p.holds for p in f.probes if p.rate <= f.lo) and not any(p.holds for p in f.probes if p.rate >= f.hi)
    # the same points as a sweep, judged by the report's own capacity rule
    rates = sorted({r for f in res.values() for r in (f.lo, f.hi)})
    out = run_sweep(load_user_config(None, SHORT + [f"traffic.rates={rates}", "strategies=[dynamic, continuous]"]),
                    tmp_path / "sweep")
    summary, _, config = load_results(out)
    caps = capacities(summary, load_requests(out), config["slo"])
    for s, f in res.items():
        assert caps[s].rate == f.lo and caps[s].broke_at == f.hi


def test_a_tpot_only_slo_still_fails_a_growing_queue():
    res, _ = found(["slo={tpot_s: 1.0}"], ["continuous"], high=200.0)
    f = res["continuous"]
    edge = next(p for p in f.probes if p.rate == f.hi)
    assert edge.attainment >= 0.9                              # TPOT fine: the queue is what failed,
    assert edge.served < 0.95 or edge.rate >= f.saturated_req_s   # by the window or by the saturated rate
    # nothing at or above what the strategy completes saturated holds, whatever its window read
    assert f.lo < f.saturated_req_s and not any(p.holds for p in f.probes if p.rate >= f.saturated_req_s)


def test_on_ray_the_search_takes_fewer_rounds_to_the_same_bracket(ray_local):
    here, _ = found([], ["continuous"])
    there, _ = found([], ["continuous"], RayExecutor(ExecutorConfig(kind="ray")), width=2)
    a, b = here["continuous"], there["continuous"]
    assert max(p.round for p in b.probes) < max(p.round for p in a.probes)
    assert b.lo <= a.hi and a.lo <= b.hi                        # the brackets overlap: one capacity


def test_cli_writes_json(tmp_path):
    res = CliRunner().invoke(capacity_cmd, ["--set", "traffic.duration_s=20", "--strategy", "continuous", "--low", "5",
                                            "--high", "80", "--tolerance", "0.1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "continuous: sustains" in res.output
    data = json.loads((tmp_path / "capacity.json").read_text())
    assert data["strategies"]["continuous"]["sustains"] > 5 and data["rule"] == "core/sustain.py"


@pytest.mark.parametrize("args, needle", [
    (["--low", "50", "--high", "10"], "--low < --high"),
    (["--tolerance", "0"], "--tolerance"),
    (["--strategy", "server"], "not in the config's strategies"),
    (["--set", "backend.kind=hf", "--set", "backend.model=tiny"], "searches the simulator"),
    (["--high", "1e9"], "traffic.rates"),
])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle):
    res = CliRunner().invoke(capacity_cmd, args + ["--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and needle in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
