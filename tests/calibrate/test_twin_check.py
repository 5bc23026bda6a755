"""What a twin predicts: the knee searched and judged as a live server's, and a what-if burst."""
from batchlab.calibrate.twin_check import Twin, predicted_burst, predicted_knee
from batchlab.core.traffic import fixed_burst
from batchlab.run.config import load_config


def twin(*sets):
    return Twin(load_config(None, ["backend.kind=sim", "backend.preset=llama2-7b-a100", "strategies=[continuous]",
                                   "continuous.max_num_seqs=32", "traffic.duration_s=20", "traffic.warmup_s=2",
                                   "slo.tpot_s=0.05", "slo.ttft_s=1.0", *sets]))


def test_a_burst_sends_n_requests_at_once():
    items = fixed_burst(5, 100, 20)
    assert len(items) == 5 and {(i.arrival, i.prompt_len, i.output_len) for i in items} == {(0.0, 100, 20)}


def test_a_higher_sequence_cap_buys_burst_throughput_at_the_cost_of_tpot():
    t = twin()
    small, large = predicted_burst(t, 256, 128, 64, max_num_seqs=8), predicted_burst(t, 256, 128, 64, max_num_seqs=128)
    assert large["tok_s"] > 2 * small["tok_s"] and large["tpot_p50"] > small["tpot_p50"]
    assert small["failed"] == large["failed"] == 0
    assert t.cfg.continuous.max_num_seqs == 32          # the what-if leaves the twin itself alone


def test_the_knee_is_a_rate_the_twin_holds_and_the_failed_rate_one_it_does_not():
    t = twin()
    k = predicted_knee(t, t.cfg.traffic, t.cfg.slo, bracket=(1.0, 200.0), tolerance=0.1, max_points=12)
    assert k["sustained_rate"] < k["failed_rate"]
    by_rate = {p["rate"]: p["sustained"] for p in k["points"]}
    assert by_rate[k["failed_rate"]] is False
    assert by_rate.get(k["sustained_rate"], True) is True
    assert [p["rate"] for p in k["points"]] == k["probes"]
