import pytest

from batchlab.backends.cost import StepCost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.core.clock import VirtualClock
from batchlab.core.request import Status
from batchlab.run.config import load_config
from batchlab.run.point import run_point
from batchlab.run.replicas import make_replicas, serve_replicated
from batchlab.run.router import LeastOutstanding, RoundRobin
from tests.fakes import UnitStepBackend, make_requests


def route(router, arrivals, outputs, n=2, strategy="continuous"):
    cfg = load_config(None, ["continuous.num_kv_blocks=100", "dynamic.max_wait_ms=0"])
    reqs = make_requests(arrivals, outputs)
    replicas = make_replicas(cfg, strategy, UnitStepBackend(), n)
    clock = VirtualClock()
    clock.run(serve_replicated(reqs, replicas, router, clock))
    assert all(r.status is Status.FINISHED for r in reqs)
    return [rep.assigned for rep in replicas], {r.request_id: r for r in reqs}


def test_round_robin_takes_turns_whatever_the_load():
    assigned, _ = route(RoundRobin(), [0, 0.5, 2, 3.5, 4], [10, 1, 1, 1, 1], n=2)
    assert assigned == [["R1", "R3", "R5"], ["R2", "R4"]]


def test_least_outstanding_avoids_the_busy_replica():
    # R1 holds replica 0 for 10 steps; the short requests keep finishing on replica 1.
    assigned, reqs = route(LeastOutstanding(), [0, 0.5, 2, 3.5, 4.7], [10, 1, 1, 1, 1], n=2)
    assert assigned == [["R1"], ["R2", "R3", "R4", "R5"]]
    assert reqs["R3"].scheduled_time == 2 and reqs["R3"].completion_time == 3


def test_least_outstanding_breaks_ties_by_turn():
    assigned, _ = route(LeastOutstanding(), [0, 10, 20, 30], [1, 1, 1, 1], n=3)
    assert assigned == [["R1", "R4"], ["R2"], ["R3"]]


def test_requests_keep_their_planned_arrival_behind_a_busy_replica():
    # One replica, request-level: R2 arrives during R1's batch and waits for it to end.
    assigned, reqs = route(RoundRobin(), [0, 1], [5, 1], n=1, strategy="dynamic")
    assert reqs["R2"].arrival_time == 1 and reqs["R2"].scheduled_time == 5


SEED = StepCost(0.025, 0.0, 0.0, 0.0, 0.0004, kv_bytes_per_token=1, kv_budget_bytes=10**12, name="linear")


def seed_point(replicas, router="round_robin", strategy="continuous"):
    cfg = load_config(None, [f"backend.replicas={replicas}", f"backend.router={router}", f"strategies=[{strategy}]",
                             "continuous.max_num_seqs=87", "continuous.max_num_batched_tokens=100000",
                             "traffic.prompt_len=16", "traffic.output_len=200", "traffic.duration_s=30",
                             "traffic.warmup_s=5"])
    return run_point(cfg, strategy, 40.0, 0, SimulatedBackend(SEED))


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
def test_replicated_run_through_the_runner_finishes_everything(router):
    res = seed_point(6, router)
    assert res.summary["failed"] == 0 and res.summary["unfinished"] == 0
    assert res.summary["finished"] == res.summary["num_requests"]
    # The batch cap bounds every step at 25 + 0.4 x 87 = 59.8 ms, so TPOT can never exceed it.
    assert res.summary["tpot_p95"] <= 0.0598 + 1e-9


def test_too_few_replicas_fall_behind():
    few, enough = seed_point(4), seed_point(6)
    # 4 replicas x ~7.3 req/s < 40 req/s: the queue grows through the run.
    assert few.summary["queue_wait_p99"] > 10 * enough.summary["queue_wait_p99"]
    assert few.summary["ttft_p50"] > 1.0


def test_one_replica_is_the_plain_path():
    cfg = load_config(None, ["strategies=[continuous]", "traffic.duration_s=5", "traffic.warmup_s=1"])
    a = run_point(cfg, "continuous", 5.0, 0, SimulatedBackend(SEED))
    b = run_point(cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"replicas": 1})}),
                  "continuous", 5.0, 0, SimulatedBackend(SEED))
    assert [r.token_times for r in a.requests] == [r.token_times for r in b.requests]
