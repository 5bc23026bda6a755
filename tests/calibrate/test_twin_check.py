"""What a twin predicts: the knee searched and judged as a live server's, a what-if burst, and the
twin scaled to a burst measured on the server."""
from dataclasses import replace

import pytest

from batchlab.calibrate.twin_check import (
    Twin,
    alternation,
    measured_change,
    point_figures,
    predicted_burst,
    predicted_knee,
    scaled_to_burst,
    stalled,
    steps_over,
)
from batchlab.core.request import Request, Status
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


@pytest.mark.parametrize("cap", [8, 16, 64])
def test_a_burst_counts_the_steps_the_twin_took(cap):
    """64 requests whose prompts all fit one step's token budget: each wave of `cap` takes one
    prompt step (its first token) and 7 decode steps, and the next wave starts the step after."""
    got = predicted_burst(twin(), 64, 16, 8, max_num_seqs=cap)
    assert got["steps"] == 64 // cap * 8 and got["failed"] == 0


def test_a_twin_whose_front_end_hands_requests_over_one_at_a_time_splits_each_waves_prompts():
    """All 64 prompts of a wave fit one step's token budget: handed over at once they are computed
    in one step a wave; one at a time, each wave's prompts fall into several steps beside rows
    still decoding, and so does every wave after (the lengths are all alike)."""
    at_once = predicted_burst(twin(), 256, 16, 8, max_num_seqs=64)
    cost = twin().simulator().cost
    serial = Twin(twin().cfg, cost=replace(cost, frontend_s=0.002, frontend_on_engine=True))
    one_by_one = predicted_burst(serial, 256, 16, 8, max_num_seqs=64)
    assert steps_over(at_once["step_sizes"], 64) == 4 and at_once["step_sizes"]["64"] == 28
    assert steps_over(one_by_one["step_sizes"], 64) > 4


def test_steps_over_the_cap_count_exact_sizes_and_a_servers_buckets_alike():
    assert steps_over({"32": 372, "2080": 12}, 32) == 12
    assert steps_over({"16": 1, "32": 349, "128": 12, "1024": 12, "2048": 12, "inf": 0}, 32) == 36


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
    long = arrival_cost(t.replay, 1, (384, 2), "long_")
    assert long["long_prompt"] == 384 and long["long_size"] == 1 and "arrival_s" not in long
    assert long["long_arrival_s"] > base["arrival_s"]                   # more prompt tokens in its step
    with pytest.raises(ValueError, match="must divide 30"):
        arrival_cost(t.replay, 7)
    done = finish_cost(t.replay)
    assert done["finish_s"] == pytest.approx(0.0, abs=1e-9) and done["finish_steps"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("preset", ["toy", "llama2-7b-a100"])
def test_what_arrivals_add_read_inside_one_run_is_what_two_runs_read_on_a_twin(preset):
    """In virtual time the machine never moves between the run alone and the run with arrivals,
    so the within-run reading (the gaps while arrivals were there, less a line through the rest)
    agrees with the two-run one; with a step that grows with its rows' context (the 7B preset)
    too, because the line follows that growth."""
    from batchlab.calibrate.twin_check import SHORT, arrival_seconds
    t = twin(f"backend.preset={preset}")
    for clump, short in ((1, SHORT), (6, SHORT), (1, (384, 2))):
        extra, *_, inside = arrival_seconds(t.replay, clump, short)
        assert inside == pytest.approx(extra, rel=0.05) and inside > 0


def test_within_reads_a_machine_that_slows_between_runs_as_nothing():
    """A hand-stamped stream at 11 ms a token throughout (a machine slower than in some run alone,
    which two runs would charge to the arrivals) reads nothing inside its own run; three extra
    milliseconds on each of five gaps while the arrivals were there read as 15 ms."""
    from batchlab.calibrate.twin_check import within

    def stream(step: float, bumped: range = range(0)) -> Request:
        return stamped(0.0, [0.1 + step * i + 0.003 * sum(1 for j in bumped if j <= i) for i in range(400)])

    arrivals = [stamped(1.5 + 0.05 * k, [1.51 + 0.05 * k, 1.52 + 0.05 * k]) for k in range(30)]
    assert within([stream(0.011)] + arrivals, 400) == pytest.approx(0.0, abs=1e-9)
    assert within([stream(0.011, range(200, 205))] + arrivals, 400) == pytest.approx(0.015, rel=0.02)


def stamped(arrival: float, times: list[float]) -> Request:
    r = Request(f"r{arrival}", 8, len(times), arrival)
    r.token_times, r.status = list(times), Status.FINISHED
    return r


def test_a_stall_is_a_long_silence_with_a_stream_mid_decode():
    steady = [0.1 + 0.005 * k for k in range(40)]                     # 0.100 ... 0.295, 5 ms apart
    paused = steady[:20] + [t + 0.05 for t in steady[20:]]            # 55 ms between tokens 19 and 20
    assert stalled([stamped(0.0, steady)]) == {"stalls": 0, "stalled_s": 0.0}
    got = stalled([stamped(0.0, paused)])
    assert got["stalls"] == 1 and got["stalled_s"] == pytest.approx(0.055)
    # the same silence between one request's last token and the next's first is an idle server, not a stall
    apart = [stamped(0.0, steady), stamped(0.3, [0.35 + 0.005 * k for k in range(10)])]
    assert stalled(apart)["stalls"] == 0
    # the window counts silences that start inside it
    assert stalled([stamped(0.0, paused)], window=(0.0, 0.1))["stalls"] == 0
    assert stalled([]) == {"stalls": 0, "stalled_s": 0.0}


def test_a_points_figures_count_the_requests_after_the_warm_up():
    reqs = [stamped(0.0, [0.1, 0.2, 0.3]), stamped(2.5, [2.51, 2.52, 2.53]), stamped(3.0, [3.02, 3.03, 3.04])]
    got = point_figures(reqs, warmup_s=2.0, duration_s=10.0)
    assert got["requests"] == 2
    assert got["tpot_p50"] == pytest.approx(0.01) and got["ttft_p50"] == pytest.approx(0.015)
    assert got["stalls"] == 0


def test_alternated_pairs_give_the_workloads_ratio_on_both_sides_and_set_the_fresh_servers_pair_apart():
    def pt(server, twin):
        return {"server": {"tpot_p50": server}, "twin": {"tpot_p50": twin}}
    points = [pt(9.0, 5.0), pt(9.0, 6.0),                  # a fresh server: slow on base
              pt(5.0, 5.0), pt(6.0, 6.0), pt(6.0, 5.0), pt(7.5, 6.0)]
    got = alternation(points)
    assert [r["server"] for r in got["pairs"]] == pytest.approx([1.0, 1.2, 1.25])
    assert got["server_ratio"] == pytest.approx(1.225) and got["twin_ratio"] == pytest.approx(1.2)
    assert got["base_twin_over_server"] == pytest.approx((1.0 + 5 / 6) / 2)
    assert got["other_twin_over_server"] == pytest.approx((1.0 + 0.8) / 2)
    assert got["first_base_over_next"] == pytest.approx(9.0 / 5.0)


def test_a_cap_measured_beside_its_control_changes_by_the_median_of_its_pairs():
    first = {"measured": [{"tok_s": 1000.0}, {"tok_s": 500.0}, {"tok_s": 800.0}]}
    paired = {"measured": [{"tok_s": 1200.0}, {"tok_s": 600.0}, {"tok_s": 1040.0}], "control": first["measured"]}
    change, pairs = measured_change(paired, first, "tok_s")
    assert change == pytest.approx(0.2) and pairs == pytest.approx([0.2, 0.2, 0.3])
    # servers one after another: the caps' medians, which here read the machine's drift as +30 %
    alone = {"measured": paired["measured"]}
    assert measured_change(alone, first, "tok_s") == (pytest.approx(0.3), [])
    with pytest.raises(ValueError):                       # a pair without its other half is no pair
        measured_change(paired | {"control": first["measured"][:2]}, first, "tok_s")


def test_a_burst_run_at_once_is_judged_over_its_whole_span():
    from batchlab.calibrate.twin_check import whole_burst
    from batchlab.core.request import Request, Status
    reqs = []
    for i in range(32):                       # one batch of 32, 4 tokens each, a step of 0.1 s: all end at 0.5 s
        r = Request(f"b{i}", 8, 4, 0.0)
        r.token_times, r.status = [0.2 + 0.1 * k for k in range(4)], Status.FINISHED
        reqs.append(r)
    got = whole_burst(reqs, 4)
    assert got["span_tok_s"] == pytest.approx(32 * 4 / 0.5) and got["gap_p50"] == pytest.approx(0.1)
    assert "tok_s" not in got and "req_s" not in got          # no steady middle: no steady-middle rates
    assert got["ttft_max"] == pytest.approx(0.2) and got["rows_mean"] == pytest.approx(32 * 0.3 / 0.5)


def test_a_burst_taken_in_over_time_shows_fewer_rows_at_once_and_its_last_first_token():
    """Two waves of 16: the second taken in when the first has finished. The same steps as one
    batch of 32 would take give half the rows at once and half the rate: the burst says which."""
    from batchlab.calibrate.twin_check import whole_burst
    from batchlab.core.request import Request, Status
    reqs = []
    for i in range(32):
        r = Request(f"b{i}", 8, 4, 0.0)
        start = 0.2 if i < 16 else 0.7
        r.token_times, r.status = [start + 0.1 * k for k in range(4)], Status.FINISHED
        reqs.append(r)
    got = whole_burst(reqs, 4)
    assert got["ttft_max"] == pytest.approx(0.7) and got["span_tok_s"] == pytest.approx(32 * 4 / 1.0)
    assert got["rows_mean"] == pytest.approx(32 * 0.3 / 1.0) and got["gap_p50"] == pytest.approx(0.1)
    # intake (first first token to last): the first wave alone, its 0.1 s steps; after it, the second
    assert (got["intake_rows"], got["intake_gap"]) == (pytest.approx(16 * 0.3 / 0.5), pytest.approx(0.1))
    assert (got["after_rows"], got["after_gap"]) == (pytest.approx(16.0), pytest.approx(0.1))


def test_steps_that_take_requests_in_are_told_from_the_steps_after():
    """A first wave decodes 0.2 s steps while a second is taken in, then both decode 0.1 s steps:
    the intake's mean gap and the one after it, each with the rows decoding then."""
    from batchlab.calibrate.twin_check import whole_burst
    from batchlab.core.request import Request, Status
    reqs = []
    for i in range(32):
        r = Request(f"b{i}", 8, 5 if i < 16 else 4, 0.0)
        r.token_times = [0.2, 0.4, 0.6, 0.7, 0.8] if i < 16 else [0.6, 0.7, 0.8, 0.9]
        r.status = Status.FINISHED
        reqs.append(r)
    got = whole_burst(reqs, 4)
    assert (got["intake_rows"], got["intake_gap"]) == (pytest.approx(16.0), pytest.approx(0.2))
    assert (got["after_rows"], got["after_gap"]) == (pytest.approx(8 / 0.3), pytest.approx(0.1))
