"""Prefix caching in the continuous scheduler: keys, hits, shared blocks, LRU eviction, and a
property test that random traffic under preemption never leaks, double-frees or miscounts a block."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.core.clock import VirtualClock
from batchlab.core.request import Request
from batchlab.core.work import Step
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import ContinuousConfig, ContinuousScheduler
from batchlab.schedulers.kv_blocks import BlockPool
from batchlab.schedulers.prefix_cache import PrefixBlockPool, block_hashes
from tests.fakes import UnitStepBackend

ON = dict(block_size=4, prefix_caching=True)


def req(name, ids, out=2, at=0.0):
    return Request(name, len(ids), out, at, prompt_token_ids=list(ids))


def run(sched, reqs):
    clock = VirtualClock()
    clock.run(drive(sched, UnitStepBackend(), clock, Inbox(reqs)))


def test_a_key_names_the_block_and_everything_before_it():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    c = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a == b                      # the partial third block has no key
    assert c[1] != a[1]                                # same tokens, other prefix: other key
    assert block_hashes(None, 4) == [] and block_hashes([1, 2, 3], 4) == []


def test_off_by_default_the_pool_only_counts_and_steps_carry_no_cache_work():
    s = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=100)
    assert type(s.pool) is BlockPool
    s.add(req("a", range(12)))
    step = s.schedule(0.0)
    assert step.cache is None and step.chunks[0][1] == 12


def test_a_later_request_reuses_the_shared_prefix_and_computes_only_the_rest():
    s = ContinuousScheduler(ContinuousConfig(**ON), num_kv_blocks=100)
    a, b = req("a", [*range(8), 50, 51]), req("b", [*range(8), 60, 61, 62], at=10.0)
    run(s, [a, b])
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)
    assert b.output_len == 2 and s.pool.free == 100
    assert len(s.pool.cached) == 2                     # only a's two full blocks hold keys (b's 11 tokens: 2 full blocks, both reused)


def test_an_exact_repeat_still_computes_its_last_block_so_the_first_token_has_logits():
    s = ContinuousScheduler(ContinuousConfig(**ON), num_kv_blocks=100)
    ids = list(range(8))
    a, b = req("a", ids), req("b", ids, at=10.0)
    run(s, [a])
    s.add(b)
    step = s.schedule(10.0)
    assert step.chunks == [(b, 4)] and b.num_computed_tokens == 4 == b.num_cached_tokens
    assert len(step.cache.load) == 1 and step.cache.load[0][1] == block_hashes(ids, 4)[:1]


def test_running_requests_share_cached_blocks_by_reference_count():
    s = ContinuousScheduler(ContinuousConfig(**ON), num_kv_blocks=100)
    a, b, c = (req(n, [*range(8), k], out=5) for n, k in (("a", 90), ("b", 91), ("c", 92)))
    s.add(a)
    s.finish_step(s.schedule(0.0), 0.0)                # a's prompt computed: its 2 blocks keyed
    s.add(b)
    s.add(c)
    s.schedule(1.0)
    shared = s.pool.tables[a][:2]
    assert s.pool.tables[b][:2] == shared == s.pool.tables[c][:2]
    assert [s.pool.refs[i] for i in shared] == [3, 3]
    assert s.pool.free == 100 - 3 * 3 + 2 * 2          # 3 tables of 3 blocks, 2 of them shared


def test_cached_free_blocks_stay_until_an_allocation_needs_them_then_go_lru_tail_first():
    s = ContinuousScheduler(ContinuousConfig(**ON, max_num_seqs=1), num_kv_blocks=4)
    old, new = req("old", range(9), out=1), req("new", range(100, 109), out=1, at=5.0)
    run(s, [old])
    assert len(s.pool.cached) == 2 and s.pool.free == 4       # kept while nothing needs the blocks
    run(s, [new])                                              # 3 blocks: 2 empty + 1 evicted
    old_keys = block_hashes(list(range(9)), 4)
    assert old_keys[0] in s.pool.cached and old_keys[1] not in s.pool.cached


def test_the_router_look_changes_nothing():
    s = ContinuousScheduler(ContinuousConfig(**ON), num_kv_blocks=100)
    run(s, [req("a", range(12))])
    probe = req("p", range(12))
    assert s.cached_tokens(probe) == 8 and s.pool._keys == {}


def check(pool: PrefixBlockPool) -> None:
    """Every block is either referenced or free exactly once, and every count agrees."""
    refs = [0] * pool.num_blocks
    for r, table in pool.tables.items():
        assert pool.held[r] == len(table)
        for b in table:
            refs[b] += 1
    assert refs == pool.refs
    free = set(pool.empty) | set(pool.evictable)
    assert len(free) == len(pool.empty) + len(pool.evictable) == pool.free
    assert free == {b for b in range(pool.num_blocks) if refs[b] == 0}
    assert all(pool.key_of[b] is None for b in pool.empty)
    assert {pool.key_of[b]: b for b in range(pool.num_blocks) if pool.key_of[b] is not None} == pool.cached


PREFIXES = [list(range(i * 100, i * 100 + 12)) for i in range(3)]
# (system prompt, how much of it, output tokens, unique tail tokens, steps after arrival it is aborted; -1: never)
traffic = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9), st.integers(1, 12), st.integers(0, 3),
                             st.sampled_from([-1, -1, -1, 0, 2, 5])), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic, st.integers(6, 16), st.sampled_from([None, 3, 5]), st.sampled_from(["recompute", "reserve"]),
       st.booleans())
def test_random_traffic_never_leaks_or_double_frees_blocks(items, blocks, chunk, policy, windows):
    cfg = ContinuousConfig(block_size=4, max_num_seqs=4, chunk_size=chunk, preemption=policy, prefix_caching=True)
    s = ContinuousScheduler(cfg, num_kv_blocks=blocks, windows=windows)
    reqs = [req(f"r{i}", PREFIXES[p][:cut + 2] + [1000 + i] * tail, out=out, at=float(i % 4))
            for i, (p, cut, out, tail, _) in enumerate(items)]
    abort_at = {r: r.arrival_time + a for r, (*_, a) in zip(reqs, items) if a >= 0}
    pending, now = sorted(reqs, key=lambda r: r.arrival_time), 0.0
    for _ in range(2000):
        while pending and pending[0].arrival_time <= now:
            s.add(pending.pop(0))
        for r, t in abort_at.items():                        # a client goes away, waiting or running
            if t == now and not r.is_done and s.abort(r):
                r.fail("aborted")
        out = s.schedule(now)
        if isinstance(out, Step):
            for r, n in out.chunks:                          # what a backend does: stamp finishers
                if r.num_computed_tokens + n >= r.num_tokens:
                    r.token_times += [now + 1 + k for k in range(out.repeat)]
            for r in s.finish_step(out, now + out.repeat):
                r.status = r.status.FINISHED
        check(s.pool)
        now += 1
        if not pending and not s.has_work():
            break
    assert all(r.is_done or r in abort_at for r in reqs)
    assert s.pool.free == blocks and not s.pool.tables and not s.pool._keys
