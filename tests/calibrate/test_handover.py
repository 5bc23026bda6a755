"""The hand-over probe: a burst's prompt steps read from a server's step histogram, and the
front-end engine time whose twin splits the burst the same way."""
from dataclasses import asdict, replace

import pytest

from batchlab.backends.cost import StepCost
from batchlab.calibrate import handover as H
from batchlab.calibrate.twin_check import Twin
from batchlab.run.config import validate

BOUNDS = ["1", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096", "8192", "16384", "inf"]
PROBE = H.HandOverProbe()
FIT = H.HandOverProbe(fit=True)


def twin() -> tuple[Twin, StepCost]:
    cost = StepCost(overhead_s=0.004, weight_s=0.0, kv_s_per_token=0.0, prefill_s_per_token=8e-5, decode_s_per_row=2.5e-4,
                    prefill_step_s=0.0, kv_bytes_per_token=1, kv_budget_bytes=1 << 40, frontend_on_engine=True,
                    frontend_s=0.0, first_token_s=0.005)
    cfg = validate({"strategies": ["continuous"], "continuous": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
                   "test: ")
    return Twin(cfg, cost=cost), cost


def test_a_twins_exact_step_sizes_fall_in_the_servers_buckets():
    assert H.bucketed({"17": 1, "65": 2, "2080": 1, "5": 3}, BOUNDS) == {
        **dict.fromkeys(BOUNDS, 0.0), "8": 3.0, "32": 1.0, "128": 2.0, "4096": 1.0}


def test_prompt_steps_are_the_buckets_above_the_bursts_rows_and_apart_counts_steps_off():
    sizes = {"8": 30.0, "32": 0.0, "128": 1.0, "1024": 1.0, "2048": 1.0}
    assert H.prompt_steps(sizes, PROBE) == {"128": 1.0, "1024": 1.0, "2048": 1.0}
    assert H.apart({"128": 1.0, "2048": 1.0}, {"128": 1.0, "1024": 1.0, "2048": 1.0}) == 1
    assert H.apart({"4096": 1.0}, {"128": 1.0, "2048": 1.0}) == 3


def test_a_probe_whose_prompts_could_pass_for_decode_steps_is_refused():
    with pytest.raises(ValueError, match="told from decode steps"):
        H.HandOverProbe(requests=32, prompt=16)
    with pytest.raises(ValueError, match="at least one"):
        H.HandOverProbe(rounds=0)


def test_the_front_end_on_the_engine_splits_a_burst_and_none_does_not():
    tw, cost = twin()
    at_once = H.prompt_steps(H.on_twin(tw, cost, PROBE, BOUNDS), PROBE)
    assert at_once == {"4096": 1.0}                       # 32 prompts of 64 tokens and a token each: 2080
    one_by_one = H.prompt_steps(H.on_twin(tw, H.engine_time(cost, 0.001, 0.005), PROBE, BOUNDS), PROBE)
    assert sum(one_by_one.values()) > 1


def test_the_fit_finds_an_engine_time_that_splits_as_the_server_did():
    tw, cost = twin()
    server = [H.on_twin(tw, H.engine_time(cost, 0.0012, 0.005), PROBE, BOUNDS)] * 3
    found = H.fit(server, tw, cost, 0.005, FIT)
    assert found.apart == 0 and found.apart_priced > 0 and found.priced_s == 0.0
    again = H.prompt_steps(H.on_twin(tw, H.engine_time(cost, found.engine_s, 0.005), PROBE, BOUNDS), PROBE)
    assert again == H.prompt_steps(server[0], PROBE) == found.twin
    # of the engine times that split it so, the one nearest the price (here none): every smaller one splits otherwise
    smaller = found.engine_s - H.GRID_STEP_S
    assert H.prompt_steps(H.on_twin(tw, H.engine_time(cost, smaller, 0.005), PROBE, BOUNDS), PROBE) != found.twin
    applied = H.applied(cost, found, 0.005)
    assert applied.frontend_s == found.engine_s and applied.first_token_s == pytest.approx(0.005 - found.engine_s)
    # a probe that did not ask for the fit records what it found and keeps the price
    kept = H.fit(server, tw, cost, 0.005, PROBE)
    assert kept.engine_s == found.engine_s and H.applied(cost, kept, 0.005) is cost


def test_a_price_that_already_splits_as_the_server_did_is_kept():
    tw, cost = twin()
    priced = H.engine_time(cost, 0.00123, 0.005)
    server = [H.on_twin(tw, priced, PROBE, BOUNDS)] * 3
    found = H.fit(server, tw, priced, 0.005, FIT)
    assert found.engine_s == found.priced_s == 0.00123 and found.apart == 0
    assert H.applied(priced, found, 0.005) is priced


def test_rounds_that_disagree_are_judged_by_their_median():
    tw, cost = twin()
    split = H.on_twin(tw, H.engine_time(cost, 0.0012, 0.005), PROBE, BOUNDS)
    whole = H.on_twin(tw, cost, PROBE, BOUNDS)
    found = H.fit([split, split, whole], tw, cost, 0.005, PROBE)
    assert found.twin == H.prompt_steps(split, PROBE) and found.apart == 0


def test_a_front_end_off_the_engine_is_recorded_not_fitted():
    tw, cost = twin()
    off = replace(cost, frontend_on_engine=False, frontend_s=0.002)
    server = [H.on_twin(tw, H.engine_time(cost, 0.0012, 0.005), PROBE, BOUNDS)]
    found = H.fit(server, tw, off, 0.005, FIT)
    assert found.engine_s == found.priced_s == 0.002 and found.twin == found.twin_priced == {"4096": 1.0}
    assert H.applied(off, found, 0.005) is off


def test_the_server_is_read_around_each_round_and_a_server_without_the_histogram_gives_none():
    readings = iter([{8.0: 10.0, 128.0: 11.0, 2048.0: 12.0, float("inf"): 12.0},
                     {8.0: 40.0, 128.0: 42.0, 2048.0: 44.0, float("inf"): 44.0}])
    sent = []
    got = H.read_server(sent.append, lambda: next(readings), replace(PROBE, rounds=1), sleep=lambda s: None)
    assert got == [{"8": 30.0, "128": 1.0, "2048": 1.0, "inf": 0.0}]
    assert len(sent) == 1 and len(sent[0]) == PROBE.requests and len({t.content for t in sent[0]}) == PROBE.requests
    assert H.read_server(sent.append, lambda: None, PROBE, sleep=lambda s: None) is None and len(sent) == 1


def test_a_saved_profiles_readings_come_back_with_their_probe():
    tw, cost = twin()
    server = [H.on_twin(tw, H.engine_time(cost, 0.0012, 0.005), PROBE, BOUNDS)]
    record = {"hand_over": H.fit(server, tw, cost, 0.005, PROBE).record()}
    assert H.from_record(record) == (server, PROBE) and H.from_record({}) is None


def test_prompt_steps_are_said_round_by_round():
    rounds = [{"8": 30.0, "128": 1.0, "1024": 1.0, "2048": 1.0}, {"8": 28.0, "128": 1.0, "1024": 2.0}, {"4096": 1.0}]
    assert H.described(rounds, asdict(PROBE)) == "3 steps (≤128, ≤1024, ≤2048); 3 steps (≤128, ≤1024 ×2); 1 step (≤4096)"


def test_what_the_fit_found_is_said_taken_or_not():
    ho = {"engine_s": 0.00065, "priced_s": 0.0, "probe": asdict(PROBE), "twin": {"128": 1.0, "2048": 1.0}}
    assert H.handed(ho) == ("the fit found 0.65 ms, splitting it in 2 steps (≤128, ≤2048), not taken (the twin keeps "
                            "the price; --hand-over-fit takes it)")
    assert H.handed(ho | {"probe": asdict(FIT)}) == "the twin takes 0.65 ms, splitting it in 2 steps (≤128, ≤2048)"
    assert H.handed(ho | {"engine_s": 0.0}) == "the fit keeps that price"
