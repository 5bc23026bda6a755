import pytest

from batchlab.backends.cost import StepCost
from batchlab.backends.presets import PRESETS, load_cost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.errors import ConfigError
from batchlab.run.config import load_config
from batchlab.run.point import run_point


def stamps(res):
    return [(r.request_id, r.status.value, r.scheduled_time, tuple(r.token_times), r.num_preemptions,
             sorted(r.breakdown.items())) for r in res.requests]


@pytest.mark.parametrize("overrides", [
    [],                                                            # roomy cache
    ["continuous.num_kv_blocks=300", "continuous.block_size=16"],  # preemption and recompute
    ["continuous.num_kv_blocks=300", "continuous.preemption=reserve"],
    ["continuous.max_num_seqs=8", "continuous.chunk_size=64"],
    # chunked recompute after preemptions, admission held back by the token budget
    ["continuous.max_num_batched_tokens=300", "continuous.chunk_size=100", "continuous.num_kv_blocks=400"],
    ["continuous.prefix_caching=true", "continuous.num_kv_blocks=500",
     "traffic.prefix={groups: 4, tokens: 512, zipf: 1.0}"],
])
def test_decode_windows_are_bit_identical_to_single_steps(overrides):
    cfg = load_config(None, ["traffic.duration_s=40", "traffic.warmup_s=0", "traffic.rates=[30]",
                             "traffic.prompt_len={dist: uniform, low: 16, high: 400}",
                             "traffic.output_len={dist: uniform, low: 4, high: 300}", *overrides])
    fast = SimulatedBackend(load_cost("llama2-7b-a100"))
    slow = SimulatedBackend(load_cost("llama2-7b-a100"), decode_windows=False)   # its scheduler then offers none
    calls, step = [], fast.step

    async def counted(s, clock):
        calls.append(s)
        return await step(s, clock)
    fast.step = counted
    a = run_point(cfg, "continuous", 30.0, 0, fast)
    b = run_point(cfg, "continuous", 30.0, 0, slow)
    assert stamps(a) == stamps(b)              # every stamp and every phase, bit for bit
    assert fast.steps == slow.steps and fast.busy_s == pytest.approx(slow.busy_s)
    assert all(r.status.value == "finished" for r in a.requests)
    assert len(calls) < fast.steps             # windows did run


def test_padded_batch_costs_like_the_longest_row():
    c = StepCost(overhead_s=0.0, weight_s=1.0, kv_s_per_token=0.01, prefill_s_per_token=0.1,
                 decode_s_per_row=0.0, kv_bytes_per_token=1, kv_budget_bytes=10**6)
    t = SimulatedBackend(c).batch_step_times([10, 2], [3, 1])
    # 2 rows padded to prompt 10; 3 steps (longest output); prefill charged for 2 x 10 tokens
    assert list(t) == pytest.approx([1 + 0.01 * 20 + 0.1 * 20, 1 + 0.01 * 22, 1 + 0.01 * 24])


def test_presets_are_sane_and_unknown_preset_is_a_config_error():
    for name in PRESETS:
        c = load_cost(name)
        assert c.kv_budget_bytes > 0 and c.step_time(0, 0, 1) > 0
    a100 = load_cost("llama2-7b-a100")
    assert a100.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2        # 0.5 MiB per token
    assert 0.005 < a100.weight_s < 0.02                             # ~13.5 GB at ~1.6 TB/s
    with pytest.raises(ConfigError, match="unknown preset"):
        load_cost("h100-9000")


def test_simulated_oom_fails_naive_but_dynamic_backs_off():
    cfg = load_config(None, ["traffic.duration_s=20", "traffic.warmup_s=0", "traffic.prompt_len=100",
                             "traffic.output_len=100", "naive.batch_size=8", "dynamic.max_batch_size=8",
                             "dynamic.max_wait_ms=1000"])
    tight = StepCost(1e-3, 1e-3, 0, 0, 0, kv_bytes_per_token=1, kv_budget_bytes=200 * 5)  # 5 rows fit
    naive = run_point(cfg, "naive", 20.0, 0, SimulatedBackend(tight))
    failed = [r for r in naive.requests if r.status.value == "failed"]
    assert len(failed) >= 8
    assert all(r.error == "out of memory — a batch of 8 padded to 200 tokens needs 1,600 KV tokens, budget 1,000"
               for r in failed)                 # the backend's reason, not a bare "out of memory"
    assert all(r.is_done for r in naive.requests)   # failed or finished: none lost
    dyn = run_point(cfg, "dynamic", 20.0, 0, SimulatedBackend(tight, enforce_memory=True))
    assert all(r.status.value == "finished" for r in dyn.requests)


@pytest.mark.parametrize("blocks", [1000, 2000])
def test_decode_windows_never_evict_a_cached_prefix_that_single_steps_keep(blocks):
    """Multi-turn chat over a full prefix cache: a window cut short by an arrival hands back the
    blocks it booked ahead, but not the prefixes it would have evicted to get them."""
    cfg = load_config(None, [
        "traffic.duration_s=120", "traffic.warmup_s=10", "traffic.rates=[1]",
        "traffic.prompt_len={dist: uniform, low: 32, high: 256}", "traffic.output_len={dist: uniform, low: 32, high: 256}",
        "traffic.prefix={groups: 4, tokens: 512, zipf: 1.0}",
        "traffic.sessions={turns: 6, think_s: 5.0, think: exponential,"
        " message_len: {dist: lognormal, median: 64, sigma: 0.6, low: 8, high: 512}}",
        "continuous.prefix_caching=true", f"continuous.num_kv_blocks={blocks}"])
    fast = SimulatedBackend(load_cost("llama2-7b-a100"))
    slow = SimulatedBackend(load_cost("llama2-7b-a100"), decode_windows=False)
    assert stamps(run_point(cfg, "continuous", 1.0, 0, fast)) == stamps(run_point(cfg, "continuous", 1.0, 0, slow))


def test_a_front_end_on_the_engine_slows_its_steps_and_windows_stay_bit_identical():
    from dataclasses import replace
    cfg = load_config(None, ["traffic.duration_s=30", "traffic.warmup_s=0", "traffic.rates=[20]",
                             "traffic.prompt_len={dist: uniform, low: 16, high: 400}",
                             "traffic.output_len={dist: uniform, low: 4, high: 300}"])
    beside = replace(load_cost("llama2-7b-a100"), frontend_s=0.004)
    shared = replace(beside, frontend_on_engine=True)
    a = run_point(cfg, "continuous", 20.0, 0, SimulatedBackend(shared))
    b = run_point(cfg, "continuous", 20.0, 0, SimulatedBackend(shared, decode_windows=False))
    assert stamps(a) == stamps(b)
    apart = SimulatedBackend(beside)
    c = run_point(cfg, "continuous", 20.0, 0, apart)
    together = SimulatedBackend(shared)
    run_point(cfg, "continuous", 20.0, 0, together)
    # the same steps, each longer by the front end's work done meanwhile: at most 4 ms a request
    assert 0 < together.busy_s - apart.busy_s <= 0.004 * len(c.requests) + 1e-9


def _per_row_runs(trace, cap):
    """How much longer the engine was busy with a per-row arrival price than without one."""
    from dataclasses import replace
    cfg = load_config(None, ["traffic.warmup_s=0", f"continuous.max_num_seqs={cap}"])
    plain = load_cost("llama2-7b-a100")
    priced = SimulatedBackend(replace(plain, admit_s_per_row=1e-3))
    bare = SimulatedBackend(plain)
    run_point(cfg, "continuous", 1.0, 0, priced, trace)
    run_point(cfg, "continuous", 1.0, 0, bare, trace)
    return priced.busy_s - bare.busy_s


def test_a_per_row_arrival_price_is_paid_by_arrivals_taken_as_they_come_not_from_a_queue():
    from batchlab.core.trace_item import TraceItem
    # a burst: all at once, two at a time; the first two join no running rows, the rest wait
    # in the queue for a slot, so nobody pays a row
    burst = [TraceItem(0.0, 32, 20) for _ in range(6)]
    assert _per_row_runs(burst, cap=2) == pytest.approx(0.0, abs=1e-12)
    # one long stream, then arrivals one at a time with room for them: each pays one running row
    spaced = [TraceItem(0.0, 32, 400)] + [TraceItem(0.5 + 0.5 * i, 32, 2) for i in range(4)]
    assert _per_row_runs(spaced, cap=8) == pytest.approx(4 * 1e-3, rel=1e-9)


@pytest.mark.parametrize("terms", [{"admit_s_per_row": 2e-4},
                                   # a queue behind a front end on the engine: a window must still end at each
                                   # hand-over, since the engine owes the front end's time from then on
                                   {"frontend_s": 1e-3, "frontend_on_engine": True},
                                   {"admit_s_per_row": 2e-4, "frontend_s": 1e-3, "frontend_s_per_token": 1e-5,
                                    "frontend_on_engine": True, "first_token_s": 5e-3}])
def test_windows_stay_bit_identical_with_arrival_prices_and_a_queue(terms):
    from dataclasses import replace
    cfg = load_config(None, ["traffic.duration_s=30", "traffic.warmup_s=0", "traffic.rates=[40]",
                             "traffic.prompt_len={dist: uniform, low: 16, high: 400}",
                             "traffic.output_len={dist: uniform, low: 4, high: 300}", "continuous.max_num_seqs=16"])
    cost = replace(load_cost("llama2-7b-a100"), **terms)
    a = run_point(cfg, "continuous", 40.0, 0, SimulatedBackend(cost))
    b = run_point(cfg, "continuous", 40.0, 0, SimulatedBackend(cost, decode_windows=False))
    assert stamps(a) == stamps(b)
    assert sum(r.breakdown.get("wait_capacity", 0.0) > 0.01 for r in a.requests) > 100   # a queue did form
    assert all(r.status.value == "finished" for r in a.requests)


# ---- a model's shape priced on a catalog GPU ---------------------------------------------------
ROOF = ["backend.shape=random:llama3-8b", "backend.gpu=H100-SXM"]


def test_a_shape_on_a_gpu_is_the_roofline_and_prices_its_gpus():
    from batchlab.backends.base import Pricing
    from batchlab.backends.gpus import gpu
    from batchlab.backends.model_shape import load_shape
    from batchlab.backends.roofline import roofline
    b = load_config(None, ROOF + ["backend.tp=2"]).backend
    assert b.cost() == roofline(load_shape("random:llama3-8b"), gpu("H100-SXM"), 2)
    assert b.build(None).vocab == 128256                 # the model's own vocabulary
    assert b.pricing() == Pricing(2, gpu("H100-SXM").usd_per_hour)
    assert load_config(None, ROOF + ["backend.usd_per_gpu_hour=1.5"]).backend.pricing() == Pricing(1, 1.5)
    assert load_config(None, ["backend.usd_per_gpu_hour=2"]).backend.pricing() == Pricing(1, 2.0)   # a preset, priced
    assert load_config(None, []).backend.pricing() is None


@pytest.mark.parametrize("sets, needle", [
    (["backend.shape=random:llama3-8b"], "go together"),
    (["backend.gpu=H100-SXM"], "go together"),
    (["backend.tp=2"], "need backend.shape"),
    (ROOF + ["backend.linear={step_ms: 1}"], "not two"),
])
def test_a_roofline_needs_its_shape_and_gpu_and_nothing_else(sets, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, sets)


@pytest.mark.parametrize("sets, needle", [
    (["backend.shape=random:llama3-70b", "backend.gpu=H100-SXM"], "raise backend.tp"),
    (["backend.shape=random:llama3-8b", "backend.gpu=V100"], "not in the catalog"),
    (["backend.shape=random:llama3-8b", "backend.gpu=A100-80GB", "backend.dtype=fp8"], "no FP8"),
])
def test_preflight_refuses_a_roofline_that_cannot_run(sets, needle):
    cfg = load_config(None, sets)
    with pytest.raises(ConfigError, match=needle):
        cfg.backend.preflight(cfg)
