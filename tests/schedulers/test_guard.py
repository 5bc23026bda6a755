"""A policy of your own that breaks the contract is stopped where it broke: every request it
held fails with an error naming the policy, later arrivals too, the run goes on, nothing is lost."""
import pytest

from batchlab.backends import make_backend
from batchlab.errors import ConfigError
from batchlab.run.config import load_config
from batchlab.run.point import run_point
from batchlab.schedulers import Given, make_scheduler

BAD = "tests.schedulers.bad_policies"


def point(strategy, **overrides):
    sets = ["traffic.rates=[40]", "traffic.duration_s=5", "traffic.warmup_s=0", "continuous.max_num_seqs=4",
            f"strategies=[{strategy}]", *[f"{k}={v}" for k, v in overrides.items()]]
    cfg = load_config(None, sets)
    return run_point(cfg, strategy, 40.0, 0, make_backend(cfg))


@pytest.mark.parametrize("name, breach", [
    ("TooManyRows", "continuous.max_num_seqs is 4"),
    ("LosesRequests", "lost 1 request(s)"),
    ("Raises", "schedule() raised ZeroDivisionError: division by zero"),
])
def test_a_broken_policy_fails_its_requests_politely_and_loses_none(name, breach):
    res = point(f"{BAD}:{name}")
    reqs = res.requests
    assert len(reqs) == len({r.request_id for r in reqs}) > 100    # every arrival is in the results, once
    failed = [r for r in reqs if r.status.value == "failed"]
    assert failed and all(r.status.value in ("finished", "failed") for r in reqs)
    for r in failed:
        assert f"policy '{BAD}:{name}' broke the scheduler contract" in r.error and breach in r.error
    assert res.summary["failed"] == sum(1 for r in reqs if r.status.value == "failed" and r.arrival_time >= 0)


def test_a_policy_that_keeps_the_contract_runs_unguarded_results():
    """Behind the guard, a well-behaved subclass gives exactly the built-in's results."""
    plain = point("continuous")
    guarded = point("batchlab.schedulers:ContinuousScheduler")
    assert [r.token_times for r in plain.requests] == [r.token_times for r in guarded.requests]


@pytest.mark.parametrize("strategy, says", [
    ("no_such_module_xyz:Policy", "no module named 'no_such_module_xyz'"),
    (f"{BAD}:Missing", f"module '{BAD}' has no 'Missing'"),
    (f"{BAD}:NotAScheduler", "is not a subclass of batchlab.schedulers.Scheduler"),
    (f"{BAD}:NoLevel", "must set level"),
    ("fifo_deluxe", "unknown strategy 'fifo_deluxe'"),
])
def test_a_policy_that_cannot_be_loaded_is_one_clear_line(strategy, says):
    cfg = load_config(None, [f"strategies=[{strategy}]"])
    with pytest.raises(ConfigError, match="strategies: ") as e:
        make_scheduler(strategy, cfg, Given(num_kv_blocks=100))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_entry_point_policies_load_by_name(tmp_path, monkeypatch):
    (tmp_path / "edf_policy.py").write_text(
        "from batchlab.schedulers import ContinuousScheduler\n"
        "class EDF(ContinuousScheduler):\n"
        "    def next_waiting(self, now):\n"
        "        return min(self.waiting, key=lambda r: r.arrival_time + (0.5 if r.priority == 0 else 5))\n")
    dist = tmp_path / "edf_policy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: edf-policy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[batchlab.schedulers]\nedf = edf_policy:EDF\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    res = point("edf")
    assert res.summary["finished"] > 100 and res.summary["failed"] == 0


def test_the_guard_shows_the_policy_s_own_facts():
    cfg = load_config(None, ["strategies=[batchlab.schedulers:ContinuousScheduler]", "continuous.num_kv_blocks=77"])
    s = make_scheduler("batchlab.schedulers:ContinuousScheduler", cfg)
    assert s.free_blocks == s.num_kv_blocks == 77 and s.level == "iteration"
