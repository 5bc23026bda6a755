"""The cache-aware router: most cached prefix wins, within a load slack of the least loaded."""
from dataclasses import dataclass, field

from batchlab.core.clock import VirtualClock
from batchlab.core.request import Request, Status
from batchlab.run.config import load_config
from batchlab.run.replicas import make_replicas, serve_replicated
from batchlab.run.router import CacheAware, LeastOutstanding
from tests.fakes import UnitStepBackend


@dataclass
class Fake:
    index: int
    outstanding: int
    cached: dict = field(default_factory=dict)

    def cached_tokens(self, request):
        return self.cached.get(request.request_id, 0)


R = Request("x", 64, 4, 0.0)


def test_the_replica_holding_most_of_the_prefix_wins_within_the_slack():
    reps = [Fake(0, 0), Fake(1, 5, {"x": 32}), Fake(2, 3, {"x": 48})]
    assert CacheAware().pick(reps, R).index == 2


def test_a_hit_on_a_replica_past_the_slack_falls_back_to_the_least_loaded():
    router = CacheAware()
    reps = [Fake(0, 2), Fake(1, 2 + router.slack + 1, {"x": 48}), Fake(2, 4)]
    assert router.pick(reps, R).index == 0


def test_without_any_hit_it_routes_as_least_outstanding():
    loads = [[3, 1, 1], [0, 0, 0], [2, 2, 1]]
    for outstanding in loads:
        ca, lo = CacheAware(), LeastOutstanding()
        for _ in range(4):
            reps = [Fake(i, o) for i, o in enumerate(outstanding)]
            assert ca.pick(reps, R).index == lo.pick(reps, R).index


def test_requests_sharing_a_prefix_follow_it_to_one_replica():
    cfg = load_config(None, ["continuous.num_kv_blocks=100", "continuous.block_size=4",
                             "continuous.prefix_caching=true", "backend.router=cache_aware"])
    sys_a, sys_b = list(range(8)), list(range(100, 108))
    reqs = [Request(f"R{i}", 10, 2, float(i), index=i, prompt_token_ids=(sys_a if i % 2 else sys_b) + [500 + i, 600 + i])
            for i in range(8)]
    replicas = make_replicas(cfg, "continuous", UnitStepBackend(), 3)
    clock = VirtualClock()
    clock.run(serve_replicated(reqs, replicas, CacheAware(), clock))
    assert all(r.status is Status.FINISHED for r in reqs)
    where = {rid: rep.index for rep in replicas for rid in rep.assigned}
    assert len({where[r.request_id] for r in reqs[1::2]}) == 1      # every sys_a request on one replica
    assert len({where[r.request_id] for r in reqs[0::2]}) == 1
    assert sum(r.num_cached_tokens for r in reqs) == 6 * 8          # all but the first of each prefix hit
