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


def test_arrivals_cost_the_running_streams_what_the_twin_charges_them_and_a_finish_costs_nothing():
    """On a twin whose front end runs on the engine, each arrival lengthens the running streams by
    about its own engine time (front end, admission, its prompt's tokens in a step); a twin charges
    nothing when a request completes, so the step after a finish is no longer than the next."""
    from batchlab.calibrate.twin_check import arrival_cost, finish_cost
    t = twin("backend.preset=toy")
    base = arrival_cost(t.replay)
    assert base["decode_with_s"] > base["decode_alone_s"] and base["arrival_s"] > 0
    heavier = Twin(t.cfg.model_copy(update={"backend": t.cfg.backend.model_copy(update={"preset": "toy"})}), scale=2.0)
    assert arrival_cost(heavier.replay)["arrival_s"] == pytest.approx(2 * base["arrival_s"], rel=0.05)
    assert arrival_cost(heavier.replay)["arrival_steps"] == pytest.approx(base["arrival_steps"], rel=0.05)
    assert base["growth_per_100_s"] == pytest.approx(0.0, abs=1e-9)   # the toy step has no context term
    # a 7B step grows with its rows' context (K/V read); as a share of the step, not with the machine's speed
    big = arrival_cost(twin().replay)
    assert big["growth_per_100_s"] > 0
    assert arrival_cost(Twin(twin().cfg, scale=2.0).replay)["growth_per_100_share"] == pytest.approx(
        big["growth_per_100_share"], rel=0.05)
    # the same arrivals in clumps: keys of their own, beside what arriving one by one costs
    clumped = arrival_cost(t.replay, 6)
    assert clumped["clump_size"] == 6 and clumped["clump_arrival_s"] > 0
    staying = arrival_cost(t.replay, 6, (32, 48), "stay_")
    assert staying["stay_output"] == 48 and staying["stay_arrival_s"] > clumped["clump_arrival_s"]   # more rows decode
    assert clumped["clump_decode_alone_s"] == pytest.approx(base["decode_alone_s"])
    with pytest.raises(ValueError, match="must divide 30"):
        arrival_cost(t.replay, 7)
    done = finish_cost(t.replay)
    assert done["finish_s"] == pytest.approx(0.0, abs=1e-9) and done["finish_steps"] == pytest.approx(0.0, abs=1e-9)
