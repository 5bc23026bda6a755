"""The per-request latency breakdown recorded by the driver and the simulator adds up to E2E,
and stalls caused by other requests (their prefill, a preemption) are counted apart."""
import pytest

from batchlab.backends.simulated import from_config
from batchlab.core.config import load_config
from batchlab.core.metrics import per_request
from batchlab.run.point import run_point

PHASES = ("wait_busy", "wait_trigger", "wait_capacity", "prefill", "decode", "stall")


def run(strategy, *overrides):
    cfg = load_config(None, ["backend.preset=toy", "traffic.rates=[40]", "traffic.duration_s=8",
                             "traffic.warmup_s=0", "traffic.prompt_len={dist: uniform, low: 32, high: 256}",
                             "traffic.output_len={dist: uniform, low: 32, high: 256}", *overrides])
    return run_point(cfg, strategy, 40.0, 0, from_config(cfg)).requests


@pytest.mark.parametrize("strategy", ["naive", "dynamic", "continuous"])
def test_phases_add_up_to_e2e(strategy):
    reqs = run(strategy, "continuous.chunk_size=64")
    for r in reqs:
        assert sum(r.breakdown.get(p, 0.0) for p in PHASES) == pytest.approx(per_request(r)["e2e"], abs=1e-9)
        assert "stall_prefill" not in r.breakdown


def test_lockstep_batches_have_no_stalls_continuous_ones_do():
    assert all(r.breakdown.get("stall", 0.0) == 0 for r in run("naive"))
    cont = run("continuous")
    assert sum(r.breakdown.get("stall", 0.0) for r in cont) > 0


def test_a_preempted_request_is_charged_the_gap_as_a_stall():
    reqs = run("continuous", "continuous.num_kv_blocks=120")
    hit = [r for r in reqs if r.num_preemptions]
    assert hit, "the test needs preemptions: the KV cache is sized to force them"
    for r in hit:
        gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
        # the longest gap (the preemption) is stall, except the one step it would have taken anyway
        assert r.breakdown["stall"] >= max(gaps) - sorted(gaps)[len(gaps) // 2]
