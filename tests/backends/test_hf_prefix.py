"""The step engine with prefix caching: a hit really reuses the cached K/V and the tokens still
match `generate()` exactly; the simulator and the engine report the same hits on the same trace."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends.cost import StepCost  # noqa: E402
from batchlab.backends.hf_engine import StepEngine  # noqa: E402
from batchlab.backends.simulated import SimulatedBackend  # noqa: E402
from batchlab.core.clock import RealClock, VirtualClock  # noqa: E402
from batchlab.core.metrics import prefix_cache  # noqa: E402
from batchlab.core.request import Request, Status  # noqa: E402
from batchlab.run.driver import Inbox, drive  # noqa: E402
from batchlab.schedulers import ContinuousConfig  # noqa: E402
from batchlab.schedulers.continuous import ContinuousScheduler  # noqa: E402
from tests.backends.test_hf_engine import drive_all_at_once, reference, step_by_hand  # noqa: E402

# (system prompt, user message tokens, output tokens, step at which the request arrives)
MIX = [(0, 5, 6, 0), (1, 9, 4, 0), (0, 3, 7, 4), (0, 11, 5, 6), (1, 2, 8, 7), (2, 6, 5, 8), (1, 7, 6, 12)]


def shared_prefix(mix, seed=0, system_len=13, vocab=2000):
    """Requests whose prompts start with one of three system prompts (13 tokens: 3 full blocks of 4)."""
    g = torch.Generator().manual_seed(seed)
    systems = [torch.randint(10, vocab, (system_len,), generator=g).tolist() for _ in range(3)]
    out = []
    for i, (p, user, o, _) in enumerate(mix):
        ids = systems[p] + torch.randint(10, vocab, (user,), generator=g).tolist()
        out.append(Request(f"r{i}", len(ids), o, 0.0, index=i, prompt_token_ids=ids))
    return out


@pytest.mark.parametrize("chunk", [None, 5])
def test_cache_hits_reuse_stored_kv_and_match_generate_token_for_token(lm, chunk):
    reqs = shared_prefix(MIX)
    engine = StepEngine(lm[0], lm[1])
    loads = []
    real_before = engine.prefix.before

    def spy(ops, cache):
        loads.extend((r.request_id, len(keys)) for r, keys in ops.load)
        real_before(ops, cache)
    engine.prefix.before = spy
    cfg = ContinuousConfig(block_size=4, chunk_size=chunk, prefix_caching=True)
    step_by_hand(engine, ContinuousScheduler(cfg, num_kv_blocks=1000), reqs, [a for *_, a in MIX])
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]
    assert sum(r.num_cached_tokens for r in reqs) > 0
    # every hit was a real copy of stored K/V into the request's slot, block for block
    assert sorted(loads) == sorted((r.request_id, r.num_cached_tokens // 4) for r in reqs if r.num_cached_tokens)
    assert engine.cache.slot_of == {}


def test_eviction_and_preemption_keep_the_store_in_step_with_the_pool_and_tokens_exact(lm):
    """20 blocks of 4 cannot hold every sequence and every cached prefix: blocks are evicted and
    requests preempted, and the engine's store must still hold exactly what the pool keys."""
    mix = [(p, u, o, 0) for p, u, o in [(0, 3, 10, ), (1, 5, 12), (2, 2, 9), (0, 6, 11), (1, 4, 10), (2, 7, 8)]]
    reqs = shared_prefix(mix, seed=5)
    engine = StepEngine(lm[0], lm[1])
    evicted, real_before = [], engine.prefix.before
    engine.prefix.before = lambda ops, cache: (evicted.extend(ops.evict), real_before(ops, cache))
    sched = ContinuousScheduler(ContinuousConfig(block_size=4, max_num_seqs=3, prefix_caching=True), num_kv_blocks=20)
    drive_all_at_once(engine, sched, reqs)
    assert [r.status for r in reqs] == [Status.FINISHED] * len(reqs)
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]
    assert set(engine.prefix.blocks) == set(sched.pool.cached)
    assert sum(r.num_preemptions for r in reqs) >= 1 and evicted and sum(r.num_cached_tokens for r in reqs) > 0


def test_simulator_and_engine_report_the_same_hits_on_the_same_trace(lm):
    """Hits are bookkeeping: the same arrivals (all at once, so the order of events is the same in
    virtual and real time) give the same per-request cached tokens and hit rates."""
    mix = [(i % 3, 3 + i, 4, 0) for i in range(9)]
    cfg = ContinuousConfig(block_size=4, max_num_seqs=2, prefix_caching=True)
    sim_reqs, hf_reqs = shared_prefix(mix, seed=7), shared_prefix(mix, seed=7)
    cost = StepCost(0.01, 0.0, 0.0, 0.0, 0.0001, kv_bytes_per_token=1, kv_budget_bytes=10**9, name="unit")
    for reqs, backend, clock in [(sim_reqs, SimulatedBackend(cost), VirtualClock()),
                                 (hf_reqs, StepEngine(lm[0], lm[1]), RealClock())]:
        sched = ContinuousScheduler(cfg, num_kv_blocks=1000)

        async def main(reqs=reqs, backend=backend, clock=clock, sched=sched):
            t0 = clock.now()
            for r in reqs:
                r.arrival_time = t0
            await drive(sched, backend, clock, Inbox(reqs))
        clock.run(main())
    assert [r.num_cached_tokens for r in sim_reqs] == [r.num_cached_tokens for r in hf_reqs]
    sim, hf = prefix_cache(sim_reqs, 4), prefix_cache(hf_reqs, 4)
    assert sim == hf and sim["prefix_hit_rate_tokens"] > 0
