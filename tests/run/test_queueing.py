"""The simulator against queueing results from the seed and from queueing theory (M/D/1, M/G/1 by
Pollaczek–Khinchine), on long runs (virtual time: seconds)."""
import numpy as np
import pytest

from batchlab.backends.cost import StepCost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.core.metrics import batch_sizes, measured, summarize
from batchlab.run.config import load_config
from batchlab.run.point import run_point

FAST = StepCost(overhead_s=1e-4, weight_s=0.0, kv_s_per_token=0.0, prefill_s_per_token=0.0,
                decode_s_per_row=0.0, kv_bytes_per_token=1, kv_budget_bytes=10**9)


def run(strategy, rate, *overrides, duration=2000):
    cfg = load_config(None, ["traffic.prompt_len=1", "traffic.output_len=1", f"traffic.duration_s={duration}",
                             "traffic.warmup_s=0", "traffic.seed=11", *overrides])
    return run_point(cfg, strategy, rate, 0, SimulatedBackend(FAST))


@pytest.mark.parametrize("n,lam", [(8, 10.0), (16, 20.0)])
def test_naive_mean_wait_is_n_minus_1_over_2_lambda(n, lam):
    res = run("naive", lam, f"naive.batch_size={n}")
    waits = [r.scheduled_time - r.arrival_time for r in res.requests]
    expected = (n - 1) / (2 * lam)
    assert abs(np.mean(waits) / expected - 1) < 0.03


def expected_batch(lam, wait_s, cap):
    """E[min(1 + K, cap)] with K ~ Poisson(lam * wait): the first request plus whoever arrives
    before its deadline. Far from the cap this is the seed's 1 + lam * max_wait."""
    k = np.arange(0, 200)
    logp = -lam * wait_s + k * np.log(lam * wait_s) - np.cumsum(np.log(np.maximum(k, 1)))
    return float(np.sum(np.minimum(1 + k, cap) * np.exp(logp)))


@pytest.mark.parametrize("lam,wait_ms,cap", [(5.0, 50, 16), (50.0, 50, 16), (400.0, 50, 16), (20.0, 100, 2)])
def test_dynamic_batch_size_at_light_load(lam, wait_ms, cap):
    res = run("dynamic", lam, f"dynamic.max_wait_ms={wait_ms}", f"dynamic.max_batch_size={cap}",
              duration=min(1000, 20000 / lam))
    sizes = batch_sizes(res.requests)
    assert abs(sizes.mean() / expected_batch(lam, wait_ms / 1000, cap) - 1) < 0.03
    if 1 + lam * wait_ms / 1000 < cap / 2:   # the seed's closed form, far from the cap
        assert abs(sizes.mean() / (1 + lam * wait_ms / 1000) - 1) < 0.03


def long_run(strategy, *extra):
    from batchlab.backends.presets import load_cost
    c = load_config(None, ["traffic.prompt_len={dist: uniform, low: 10, high: 200}",
                           "traffic.output_len={dist: uniform, low: 10, high: 200}", "traffic.duration_s=600",
                           "traffic.warmup_s=20", *extra])
    return c, run_point(c, strategy, 5.0, 0, SimulatedBackend(load_cost("llama2-7b-a100")))


@pytest.mark.parametrize("strategy", ["naive", "dynamic", "continuous"])
def test_littles_law_holds_between_the_drivers_count_and_the_stamps(strategy):
    s = long_run(strategy)[1].summary
    assert s["failed"] == 0 and s["little_source"] == "driver"
    assert abs(s["little_L"] / s["little_lambda_W"] - 1) < 0.02 and abs(s["little_gap"]) < 0.02


def test_littles_law_flags_stamps_moved_after_the_run_on_a_long_run():
    cfg, res = long_run("continuous")
    window = (cfg.traffic.warmup_s, cfg.traffic.warmup_s + cfg.traffic.duration_s)
    shift = 0.1 * res.summary["e2e_mean"]                  # every completion 10% of a mean E2E late
    for r in res.requests:
        r.token_times[-1] += shift
    moved = summarize(measured(res.requests, window[0]), in_system=res.in_system, window=window)
    assert moved["little_gap"] == pytest.approx(1 / 1.1 - 1, abs=0.02)   # about -9%, 5x the intact bound


def test_with_two_replicas_the_summed_count_still_holds():
    s = long_run("dynamic", "backend.replicas=2")[1].summary
    assert s["little_source"] == "driver" and abs(s["little_gap"]) < 0.02


def step_cost(d: float) -> StepCost:
    """Every step costs d seconds, whatever it holds: service time = d x output tokens."""
    return StepCost(overhead_s=d, weight_s=0.0, kv_s_per_token=0.0, prefill_s_per_token=0.0,
                    decode_s_per_row=0.0, kv_bytes_per_token=1, kv_budget_bytes=10**9)


def mean_queue_wait(rate, d, *overrides, duration=4000):
    cfg = load_config(None, ["traffic.prompt_len=1", f"traffic.duration_s={duration}", "traffic.warmup_s=50",
                             "traffic.seed=3", "naive.batch_size=1", *overrides])
    res = run_point(cfg, "naive", rate, 0, SimulatedBackend(step_cost(d)))
    m = measured(res.requests, 50)
    return float(np.mean([r.scheduled_time - r.arrival_time for r in m]))


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_is_pollaczek_khinchine(rho):
    """Batch cap 1 and one 20 ms step per request: M/D/1, mean wait rho D / (2 (1 - rho))."""
    d = 0.02
    lam = rho / d
    expected = rho * d / (2 * (1 - rho))
    assert abs(mean_queue_wait(lam, d, "traffic.output_len=1") / expected - 1) < 0.05


def test_mg1_wait_needs_the_service_time_of_each_request():
    """Half the requests take 1 step, half 10 (output tokens): M/G/1, whose mean wait
    lambda E[S^2] / (2 (1 - rho)) is 1.67x what the same mean service would give if every request
    took it (M/D/1): a simulator charging by request count, not by the tokens each one decodes,
    would land on the wrong one."""
    d, rho = 0.01, 0.5
    es, es2 = 5.5 * d, 50.5 * d * d
    lam = rho / es
    mg1, md1 = lam * es2 / (2 * (1 - rho)), rho * es / (2 * (1 - rho))
    got = mean_queue_wait(lam, d, "traffic.classes=[{name: short, weight: 1, output_len: 1}, "
                                  "{name: long, weight: 1, output_len: 10}]")
    assert abs(got / mg1 - 1) < 0.06 and abs(got / md1 - 1) > 0.3
