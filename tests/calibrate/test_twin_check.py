"""What a twin predicts: the knee searched and judged as a live server's, a what-if burst, and the
twin scaled to a burst measured on the server."""
import pytest

from batchlab.calibrate.twin_check import Twin, predicted_burst, predicted_knee, scaled_to_burst
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


@pytest.mark.parametrize("slower", [1.5, 0.8])
def test_a_twin_scaled_to_the_servers_burst_runs_that_burst_at_its_rate(slower):
    """The server measured `slower` times slower than the twin: the scaled twin's own burst runs
    at the server's rate, and its knee moves the same way."""
    t = twin()
    server = predicted_burst(t, 128, 64, 32)["tok_s"] / slower
    scaled = scaled_to_burst(t, server, 128, 64, 32)
    assert predicted_burst(scaled, 128, 64, 32)["tok_s"] == pytest.approx(server, rel=0.03)
    assert scaled.scale == pytest.approx(slower, rel=0.2) and t.scale == 1.0
    # NOTE: from 5 req/s: at 1 req/s a 20-s window ends before this slow model's longest outputs do
    knee = lambda x: predicted_knee(x, t.cfg.traffic, t.cfg.slo, (5.0, 200.0), 0.1, 12)["sustained_rate"]  # noqa: E731
    assert (knee(scaled) < knee(t)) is (slower > 1)
