"""The black-box profile: step times from chunk stamps, a twin written from them, and a server
that cannot be profiled refused in one line with nothing written."""
import math

import pytest

pytest.importorskip("httpx")

from batchlab.backends.openai_client import OpenAIBackend  # noqa: E402
from batchlab.calibrate.blackbox import (  # noqa: E402
    ProbeGrid,
    before_scheduler,
    decode_gaps,
    first_admissions,
    fit_profile,
    mixed_step,
    most_samples,
    refusal,
    stream_checked,
    whole_streams,
)
from batchlab.calibrate.server import profile_server  # noqa: E402
from batchlab.core.request import Request  # noqa: E402
from batchlab.errors import ConfigError  # noqa: E402
from batchlab.run.config import load_config  # noqa: E402
from batchlab.run.sweep import run_sweep  # noqa: E402
from tests.calibrate.fake_server import FakeServer  # noqa: E402

SMALL = ProbeGrid(batch_sizes=(1, 3), contexts=(16,), prompts=(16, 64), new_tokens=16, repeats=1, warmup=0, gap_s=0.01,
                  streams=(1, 3))


def test_a_late_burst_of_chunks_leaves_the_window_mean_at_the_step():
    steps = [0.010 * k for k in range(1, 25)]
    late = steps[:9] + [steps[10]] * 2 + steps[11:]        # chunk 9 was held back and came with chunk 10
    for stamps in (steps, late):
        gaps = [g for _, g in decode_gaps([stamps], prompt=8)]
        assert gaps and all(abs(g - 0.010) < 1e-9 for g in gaps)


def test_only_steps_where_every_stream_decodes_are_taken():
    a = [0.01 * k for k in range(1, 21)]
    b = [0.05 + 0.01 * k for k in range(1, 21)]            # started later, finished later
    got = decode_gaps([a, b], prompt=8)
    assert got and all(0.06 <= s for s in [a[k - 2] for k, _ in got[:len(got) // 2]])


def test_the_mixed_step_is_the_gap_that_ends_with_the_new_first_token():
    bg = [0.01 * k for k in range(1, 13)] + [0.12 + 0.03] + [0.15 + 0.01 * k for k in range(1, 10)]
    j, step = mixed_step([bg, [bg[12] + 0.0001, bg[13]]], gap=0.01)
    assert j == 12 and abs(step - 0.03) < 1e-9
    assert mixed_step([bg, [bg[12], 1.0], [bg[14], 1.0]], gap=0.01) is None   # two prompts, not in one step


def test_a_crowd_is_read_from_the_step_holding_its_earliest_first_tokens():
    bg = [0.01 * k for k in range(1, 13)] + [0.12 + 0.03] + [0.15 + 0.01 * k for k in range(1, 10)]
    crowd = [[bg[12] + 0.0001, 1.0]] * 3 + [[bg[13], 1.0]] * 2        # three came with step 12, two a step later
    j, came, step = first_admissions([bg, *crowd], gap=0.01)
    assert (j, came) == (12, 3) and abs(step - 0.03) < 1e-9
    assert mixed_step([bg, *crowd], gap=0.01) is None                  # a probe that wants them all in one step: none
    assert first_admissions([bg, [bg[3], 1.0]], gap=0.01) is None      # too early in the stream to know its pace


@pytest.mark.parametrize("error, says", [
    ("stream ended without a usage report (exact token counts unknown)", "without usage counts"),
    ("HTTP 429: rate limit exceeded", "rate-limits"),
    ("HTTP 422: ignore_eos is not supported", "refuses the exact-length options"),
    ("backend produced 3 tokens, expected 8", "does not generate exactly"),
])
def test_a_failed_probe_says_what_the_server_lacks(error, says):
    r = Request("r", 4, 8, 0.0)
    r.fail(error)
    with pytest.raises(ConfigError, match=says) as e:
        stream_checked(r, [])
    assert "nothing was written" in str(e.value) and refusal(error) == str(e.value)


def test_a_chunk_merged_once_is_tolerated_and_a_server_that_merges_is_refused():
    r = Request("r", 4, 61, 0.0)
    r.token_times = [0.01 * k for k in range(61)]                  # 61 tokens produced
    stamps = [0.01 * k for k in range(60)]                        # one chunk carried two of them
    assert stream_checked(r, stamps) == stamps + [stamps[-1]]
    with pytest.raises(ConfigError, match="merges tokens into chunks"):
        stream_checked(r, stamps[::2])                            # two tokens a chunk throughout
    with pytest.raises(ConfigError, match="merges tokens into chunks"):
        stream_checked(r, stamps[:58])                            # three missing of 61: more than 2 %


def test_a_stream_that_fell_behind_is_read_whole_where_every_stream_decoded_together():
    """Merged chunks shift the token index, but a stream's first chunk ends its prompt's step and
    its last carries its last token: new_tokens - 1 steps between them, whatever merged."""
    steps = [0.5 + 0.010 * k for k in range(24)]                   # 24 tokens, 10 ms steps
    merged = steps[:5] + steps[6:12] + steps[13:]                # two chunks carried two tokens each
    got = whole_streams([merged, steps, steps[:3] + steps[4:]], 24)
    assert len(got) == 3 and all(k == 12 and abs(step - 0.010) < 1e-9 for k, step in got)
    late = [0.5 + 0.3 + 0.010 * k for k in range(24)]               # admitted 30 steps after the others
    assert whole_streams([merged, late], 24) == []


def test_a_decode_burst_keeps_a_stream_that_fell_behind_and_every_other_probe_refuses_it():
    r = Request("r", 4, 24, 0.0)
    r.token_times = [0.01 * k for k in range(24)]
    stamps = [0.01 * k for k in range(24)][::2]                  # two tokens a chunk throughout
    assert stream_checked(r, stamps, behind=True) == stamps
    with pytest.raises(ConfigError, match="merges tokens into chunks"):
        stream_checked(r, stamps)


def profile(fake: FakeServer, tmp_path, arrivals=None, grid=SMALL):
    cfg = load_config(None, ["backend.kind=openai", "backend.base_url=http://fake/v1", "backend.model=fake",
                             "strategies=[server]", "traffic.duration_s=2", "traffic.warmup_s=0", "traffic.rates=[5]"])
    target = OpenAIBackend("http://fake/v1", "fake", transport=fake.async_transport())
    return profile_server(cfg, grid, tmp_path / "p.json", tmp_path / "p.twin.yaml", target=target,
                          transport=fake.sync_transport(), arrivals=arrivals)


def test_a_server_that_states_its_limits_gets_a_twin_with_them(tmp_path):
    stated = {"scheduler_config": {"max_num_seqs": 12, "max_num_batched_tokens": 512, "enable_chunked_prefill": True,
                                   "long_prefill_token_threshold": 0},
              "cache_config": {"block_size": 32, "num_gpu_blocks": 900, "enable_prefix_caching": False}}
    twin = profile(FakeServer(vllm_config=stated), tmp_path)
    c = twin.continuous
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.chunk_size) == (12, 512, 512)
    text = (tmp_path / "p.twin.yaml").read_text()
    assert "continuous.max_num_seqs: 12 (server /server_info)" in text and "assumed" not in text


def test_a_server_on_the_cpu_gets_a_twin_whose_front_end_takes_engine_time(tmp_path):
    twin = profile(FakeServer(vllm_config={"device_config": {"device": "cpu"}}), tmp_path)
    cost = twin.backend.cost()
    assert cost.frontend_on_engine and cost.arrival_delay_s == cost.first_token_s and cost.frontend_engine_s == cost.frontend_s > 0
    assert "shares the processor the model runs on (device cpu, server /server_info)" in (tmp_path / "p.twin.yaml").read_text()
    gpu = profile(FakeServer(vllm_config={"device_config": {"device": "cuda"}}), tmp_path)
    assert gpu.backend.cost().frontend_engine_s == 0.0 and gpu.backend.cost().arrival_delay_s > 0


def test_a_server_is_profiled_into_a_twin_that_runs(tmp_path):
    twin = profile(FakeServer(), tmp_path)
    assert (tmp_path / "p.json").is_file() and (tmp_path / "p.twin.yaml").is_file()
    # its geometry is what the server published; its step model came from both probe kinds
    assert (twin.continuous.block_size, twin.continuous.num_kv_blocks, twin.continuous.prefix_caching) == (32, 900, False)
    text = (tmp_path / "p.twin.yaml").read_text()
    assert "continuous.num_kv_blocks: 900 (server /metrics)" in text
    cost = twin.backend.cost()
    assert cost.frontend_s >= 0 and cost.step_time(16, 0, 1) > 0
    out = run_sweep(load_config(tmp_path / "p.twin.yaml", ["report=false"]), tmp_path / "r")
    assert (out / "requests.csv").read_text().count("finished") > 0
    # the validation's drift probe, timed on the server right after the probes (its drift baseline)
    import json
    assert json.loads((tmp_path / "p.json").read_text())["reference_burst_s"] > 0


@pytest.mark.parametrize("fault, says", [
    ({"usage": False}, "without usage counts"),
    ({"merge": 2}, "merges tokens into chunks"),
    ({"refuse_eos": True}, "refuses the exact-length options"),
    ({"rate_limit": True}, "rate-limits"),
    ({"restart": True}, "restarted during the profile"),
])
def test_a_server_that_cannot_be_profiled_is_one_line_and_nothing_is_written(fault, says, tmp_path):
    with pytest.raises(ConfigError, match=says) as e:
        profile(FakeServer(**fault), tmp_path)
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_the_grid_bounds_the_samples_a_server_gives(tmp_path):
    """The bound `batchlab profile` checks before it measures holds for what a profile measured."""
    import json
    profile(FakeServer(), tmp_path)
    assert 9 <= len(json.loads((tmp_path / "p.json").read_text())["samples"]) <= most_samples(SMALL)


def test_prompts_are_probed_beside_each_stream_count(tmp_path):
    """A prefill sample per prompt beside one stream and beside three: the step holds the prompt and
    every stream's decode row, its context the streams' tokens and the prompt."""
    import json
    profile(FakeServer(), tmp_path)
    beside = [s for s in json.loads((tmp_path / "p.json").read_text())["samples"] if s["kind"] == "prefill"]
    shapes = {(s["decode_rows"], s["admitted"], s["prefill_tokens"]) for s in beside}
    assert {(3, 1, 16), (3, 1, 64)} & shapes and {(1, 1, 16), (1, 1, 64)} & shapes
    for s in beside:     # each stream decoded at least a dozen steps past its 16-token prompt before the prompt came
        assert s["context_tokens"] - s["prefill_tokens"] >= s["decode_rows"] * (16 + 7)


def test_crowds_of_prompts_give_steps_admitting_many(tmp_path):
    """Prompts sent at once beside one stream: the step holding the earliest first tokens is a
    sample keyed by how many came in it; crowds whose prompts pass crowd_tokens are not sent."""
    import json
    from dataclasses import replace
    grid = replace(SMALL, crowds=(4, 8), crowd_tokens=256)          # 8 x 64 tokens is over: not sent
    profile(FakeServer(), tmp_path, grid=grid)
    samples = json.loads((tmp_path / "p.json").read_text())["samples"]
    crowd = [s for s in samples if s["kind"] == "crowd"]
    assert crowd and max(s["admitted"] for s in crowd) > 2 and len(samples) <= most_samples(grid)
    assert all(s["decode_rows"] == 1 and s["prefill_tokens"] in (16 * s["admitted"], 64 * s["admitted"]) for s in crowd)
    assert not [s for s in crowd if s["prefill_tokens"] > 256]


def test_the_mixed_step_beside_several_streams_is_read_from_the_first_of_them():
    bg = [0.01 * k for k in range(1, 13)] + [0.12 + 0.03] + [0.15 + 0.01 * k for k in range(1, 10)]
    prompt = [bg[12] + 0.0001, bg[13]]
    assert mixed_step([bg, bg, bg, prompt], gap=0.01, background=3) == mixed_step([bg, prompt], gap=0.01)


def test_probes_that_give_too_few_samples_are_one_line_not_a_fit_error():
    from types import SimpleNamespace
    probes = SimpleNamespace(grid=ProbeGrid(), decode={(1, 16, 2): [0.01], (2, 16, 2): [0.012]},
                             mixed={(1, 1, 16, 16): [(16, 0.02)]}, crowd={}, beside=[],
                             idle={16: [0.03]}, reference=[0.01], behind={}, unread={})
    with pytest.raises(ConfigError, match="the probes gave 3 step samples") as e:
        fit_profile(probes)
    assert "\n" not in str(e.value)


def test_a_prompt_beside_a_stream_gives_one_sample_per_prompt_the_median_over_passes():
    """The stream's context at the probe moves from pass to pass; one slow timing must not set a sample."""
    from types import SimpleNamespace
    decode = {(b, 16, k): [0.010 + 0.001 * b + 0.00001 * k] for b in (1, 2, 4, 8) for k in (2, 6, 10)}
    mixed = {(1, 1, 64, 16): [(30, 0.020), (33, 0.021), (31, 0.090)], (1, 1, 256, 16): [(30, 0.040), (32, 0.041), (34, 0.039)],
             (1, 2, 64, 16): [(30, 0.030), (31, 0.031), (36, 0.029)], (4, 1, 64, 16): [(120, 0.030), (124, 0.032), (128, 0.031)],
             (4, 1, 64, 256): [(1080, 0.040), (1084, 0.042), (1088, 0.041)]}
    prof = fit_profile(SimpleNamespace(grid=ProbeGrid(), decode=decode, mixed=mixed, crowd={}, idle={64: [0.03]}, reference=[0.01],
                                       beside=[0.004, 0.006], behind={}, unread={}))
    prefill = [s for s in prof.samples if s.kind == "prefill"]
    assert [(s.decode_rows, s.admitted, s.prefill_tokens, s.context_tokens, s.seconds) for s in prefill] == [
        (1, 1, 64, 31 + 64, 0.021), (1, 1, 256, 32 + 256, 0.040), (1, 2, 128, 31 + 128, 0.030), (4, 1, 64, 124 + 64, 0.031),
        (4, 1, 64, 1084 + 64, 0.041)]
    assert prof.frontend_beside_s == 0.005          # the median of the prompts' times before the scheduler


def test_a_prompt_beside_a_stream_reached_the_scheduler_between_the_two_steps_before_its_own():
    stream = [0.010 * (i + 1) for i in range(30)]  # chunk i comes at the end of a step running (10 i, 10 (i + 1)] ms
    # sent at 92.5 ms with a 4 ms front end: in at 96.5 ms, while chunk 9's step runs; its first token
    # comes with chunk 10. The estimate, 2.5 ms, is the 4 ms within half a step (5 ms)
    assert before_scheduler(stream, 10, 0.0925) == pytest.approx(0.0025)


def test_the_twin_splits_the_front_end_into_the_engines_part_and_a_delay_beyond_it():
    from batchlab.calibrate.twin import front_end_parts
    assert front_end_parts(0.0015, 0.0046) == pytest.approx((0.0015, 0.0031))
    assert front_end_parts(0.004, 0.002) == (0.004, 0.0)        # nothing beyond: no negative delay
    assert front_end_parts(0.003, None) == (0.003, 0.0)         # a profile made before the beside reading


def test_the_idle_reading_twin_drops_every_price_the_arrival_probe_set():
    from batchlab.backends.cost import StepCost
    from batchlab.calibrate.twin import idle_reading
    priced = {"overhead_s": 0.004, "frontend_s": 0.0, "frontend_on_engine": True, "frontend_s_per_token": 5e-6,
              "admit_s_per_row": 1.4e-4, "first_token_s": 0.005, "frontend_idle_s": 0.006, "frontend_beside_s": 0.0085}
    idle = idle_reading(priced)
    assert (idle["frontend_s"], idle["first_token_s"]) == pytest.approx((0.006, 0.0025))
    assert (idle["frontend_s_per_token"], idle["admit_s_per_row"], idle["frontend_on_engine"]) == (0.0, 0.0, True)
    assert idle["overhead_s"] == 0.004 and priced["admit_s_per_row"] == 1.4e-4      # the steps kept, the input untouched
    steps = dict(overhead_s=0.004, weight_s=0.0, kv_s_per_token=0.0, prefill_s_per_token=0.0, decode_s_per_row=0.0,
                 kv_bytes_per_token=1, kv_budget_bytes=1)
    cost = StepCost(**steps, admit_s_per_row=idle["admit_s_per_row"])
    assert cost.step_time(900, 32, 20, 0.0, 1) == StepCost(**steps).step_time(900, 32, 20, 0.0, 1)   # no row priced


def test_a_profiled_twin_carries_the_beside_reading_beyond_the_front_end(tmp_path):
    import json
    twin = profile(FakeServer(frontend_s=0.02), tmp_path)      # 20 ms before the engine sees a request
    rec = json.loads((tmp_path / "p.json").read_text())
    cost = twin.backend.cost()
    assert rec["frontend_beside_s"] > 0 and cost.first_token_s == pytest.approx(max(0.0, rec["frontend_beside_s"] - cost.frontend_s))


def test_front_end_work_on_the_engine_is_priced_from_what_arrivals_cost_the_streams(tmp_path):
    import json

    from batchlab.calibrate.front_end import ArrivalProbe
    # the fake's engine spends 0.2 ms a prompt token on each new request outside its prompt's step
    # (12.8 ms for 64 tokens, against 3 ms steps): the step model cannot see it, the arrivals do
    probe = ArrivalProbe(prompts=(16, 64), streams=(2, 6), stream_output=120, rounds=1)
    twin = profile(FakeServer(engine_per_token_s=2e-4), tmp_path, arrivals=probe)
    cost = twin.backend.cost()
    assert cost.frontend_on_engine and 0.5 * 2e-4 < cost.frontend_s_per_token < 1.5 * 2e-4
    priced = json.loads((tmp_path / "p.json").read_text())["front_end_priced"]
    assert set(priced["server_s"]) == {"2", "6"} and set(priced["server_s"]["6"]) == {"16", "64"}
    assert priced["probe"]["streams"] == [2, 6] and priced["read"] == "inside one run"
    # what it holds before the scheduler beyond the engine's part stays a delay off the engine
    assert cost.first_token_s == pytest.approx(max(0.0, priced["delay_s"]))
    # refitted on its own steps, the profile gives back the same terms and the same front end
    from batchlab.backends.cost import COEFFS
    from batchlab.calibrate.fit import samples_from
    from batchlab.calibrate.twin import refitted
    rec = json.loads((tmp_path / "p.json").read_text())
    for twin in (load_config(tmp_path / "p.twin.yaml"), None):     # None: the limits the profile read
        again = refitted(rec, samples_from(rec["samples"]), twin=twin)
        for k in (*COEFFS, "frontend_s", "frontend_s_per_token", "admit_s_per_row", "first_token_s"):
            assert again[k] == pytest.approx(rec[k], rel=1e-9, abs=1e-12), k
    # without the per-admission term: held at zero, the front end priced against the new steps
    bare = refitted(rec, samples_from(rec["samples"]), ("admit_s",))
    assert bare["admit_s"] == 0 and bare["refitted"] == {"without": ["admit_s"], "samples": len(rec["samples"]),
                                                         "from": len(rec["samples"])}
    # `batchlab profile --refit` on a server's profile does the same, its front end priced again
    from click.testing import CliRunner

    from batchlab.calibrate.profile import profile_cmd
    res = CliRunner().invoke(profile_cmd, ["--refit", str(tmp_path / "p.json"), "--without", "admit_s",
                                           "--out", str(tmp_path / "q.json")])
    assert res.exit_code == 0, res.output
    q = json.loads((tmp_path / "q.json").read_text())
    assert q["admit_s"] == 0 and q["without"] == ["admit_s"]
    assert q["front_end_priced"] == json.loads(json.dumps(bare["front_end_priced"]))
    assert "refitted, without admit_s" in q["description"]


def test_a_server_whose_front_end_is_off_its_engine_gets_a_twin_that_hands_a_burst_over_faster(tmp_path):
    import json

    from batchlab.calibrate.fit import samples_from
    from batchlab.calibrate.handover import HandOverProbe, prompt_steps
    from batchlab.calibrate.twin import refitted
    # the fake's front end delays every request 2 ms at once, not one after another on its engine,
    # so a burst reaches the engine within a step or two; a twin charging the idle reading on the
    # engine hands the same burst over one request at a time, over more steps
    cfg = load_config(None, ["backend.kind=openai", "backend.base_url=http://fake/v1", "backend.model=fake",
                             "strategies=[server]", "traffic.duration_s=2", "traffic.warmup_s=0", "traffic.rates=[5]"])
    fake = FakeServer(vllm_config={"device_config": {"device": "cpu"}}, step_histogram=True)
    target = OpenAIBackend("http://fake/v1", "fake", transport=fake.async_transport())
    probe = HandOverProbe(requests=8, prompt=16, rounds=3, fit=True)
    twin = profile_server(cfg, SMALL, tmp_path / "p.json", tmp_path / "p.twin.yaml", target=target,
                          transport=fake.sync_transport(), arrivals=None, hand_over=probe)
    rec = json.loads((tmp_path / "p.json").read_text())
    ho = rec["hand_over"]
    # the server's own count, each round: every bucket it publishes, and one or two prompt steps
    assert len(ho["server"]) == 3 and all(set(r) >= {"8", "32", "128", "256", "inf"} for r in ho["server"])
    assert all(1 <= sum(prompt_steps(r, probe).values()) <= 2 for r in ho["server"])
    assert ho["priced_s"] == rec["frontend_idle_s"] > 0 and sum(ho["twin_priced"].values()) > 2
    assert ho["engine_s"] < ho["priced_s"] and ho["apart"] < ho["apart_priced"]
    cost = twin.backend.cost()
    assert cost.frontend_s == ho["engine_s"] and cost.frontend_on_engine
    # what the profile read before the scheduler stays, the rest of it a delay off the engine
    before = rec["frontend_idle_s"] + max(0.0, rec["frontend_beside_s"] - rec["frontend_idle_s"])
    assert cost.frontend_s + cost.first_token_s == pytest.approx(before)
    # refitted on its own steps, the profile takes the same hand-over
    assert refitted(rec, samples_from(rec["samples"]))["frontend_s"] == pytest.approx(cost.frontend_s)


def test_a_server_without_a_step_histogram_keeps_the_priced_front_end(tmp_path):
    import json
    twin = profile(FakeServer(vllm_config={"device_config": {"device": "cpu"}}), tmp_path)
    rec = json.loads((tmp_path / "p.json").read_text())
    assert "hand_over" not in rec and twin.backend.cost().frontend_s == rec["frontend_idle_s"]


def test_the_profile_says_how_far_its_timing_of_the_drift_probe_stood_from_its_own_replay(tmp_path):
    """A validation's drift is the server's timings over this one (validation.drift_against:
    profile): the profile prints it beside the fit's replay of the same burst, with the ratio."""
    import json

    from batchlab.backends.simulated import SimulatedBackend
    from batchlab.calibrate.validate import SERVER, burst_seconds, load_profiles
    cfg = load_config(None, ["backend.kind=openai", "backend.base_url=http://fake/v1", "backend.model=fake",
                             "strategies=[server]", "traffic.duration_s=2", "traffic.warmup_s=0", "traffic.rates=[5]"])
    fake = FakeServer()
    said: list[str] = []
    profile_server(cfg, SMALL, tmp_path / "p.json", tmp_path / "p.twin.yaml", said.append,
                   target=OpenAIBackend("http://fake/v1", "fake", transport=fake.async_transport()),
                   transport=fake.sync_transport(), arrivals=None, hand_over=None)
    line = next(s for s in said if s.startswith("drift probe:"))
    rec = json.loads((tmp_path / "p.json").read_text())
    timed, sigma = rec["reference_burst_s"], rec["fit_rms_rel_error"]
    twin = load_profiles([], str(tmp_path / "p.twin.yaml"))[SERVER]
    ratio = timed / burst_seconds(SimulatedBackend(twin.cost), SERVER, prof=twin)
    assert f"took {1e3 * timed:.0f} ms, {ratio:.2f}x the fit's replay" in line
    assert ("more than twice the fit's error apart" in line) == (abs(math.log(ratio)) > 2 * sigma)


BIG = ProbeGrid(batch_sizes=(1, 3, 8), contexts=(16,), prompts=(16, 64), new_tokens=16, repeats=1, warmup=0, gap_s=0.01,
                streams=(1, 3))


def profiled_big(fake: FakeServer, tmp_path) -> tuple[dict, list[str]]:
    """The BIG grid profiled on `fake`: its profile record and the lines the profile printed."""
    import json
    lines: list[str] = []
    cfg = load_config(None, ["backend.kind=openai", "backend.base_url=http://fake/v1", "backend.model=fake",
                             "strategies=[server]", "traffic.duration_s=2", "traffic.warmup_s=0", "traffic.rates=[5]"])
    target = OpenAIBackend("http://fake/v1", "fake", transport=fake.async_transport())
    profile_server(cfg, BIG, tmp_path / "p.json", tmp_path / "p.twin.yaml", target=target,
                   transport=fake.sync_transport(), arrivals=None, progress=lines.append)
    return json.loads((tmp_path / "p.json").read_text()), lines


def test_decode_bursts_whose_front_end_fell_behind_are_read_whole_and_said(tmp_path):
    """A front end that merges chunks only while many rows run: the profile is written, the burst
    of 8 read from its whole streams at the step the server took, and the record says so."""
    fake = FakeServer(behind_from_rows=6, gather_s=0.02)   # the reference burst (4 rows) streams a token a chunk
    record, lines = profiled_big(fake, tmp_path)
    assert record["decode_read_whole"] == [[8, 16, 1]] and "decode_unread" not in record
    eight = [s for s in record["samples"] if s["kind"] == "decode" and s["decode_rows"] == 8]
    assert len(eight) == 1 and eight[0]["seconds"] == pytest.approx(fake.step_s + 8 * fake.per_row_s, rel=0.5)
    assert any(line.startswith("decode bursts read from whole streams") and "8 rows from 16 tokens (1 of 1 passes)" in line
               for line in lines)


def test_a_burst_the_server_admits_over_many_steps_gives_no_decode_step_and_is_said(tmp_path):
    """Eight requests taken two a step while their chunks merge: the streams never decode together
    the whole way, so the burst gives no step (a wrong one would be worse); the rest of the profile stands."""
    record, lines = profiled_big(FakeServer(behind_from_rows=6, admit_per_step=2, gather_s=0.02), tmp_path)
    assert record["decode_unread"] == [[8, 16, 1]]
    assert not [s for s in record["samples"] if s["kind"] == "decode" and s["decode_rows"] == 8]
    assert any(line.startswith("decode bursts that gave no step") for line in lines)
