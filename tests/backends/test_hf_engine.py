"""The step engine against `generate()`: same greedy tokens whatever the arrivals, chunks, preemptions.

NOTE: the model is the tiny Llama loaded in float64. In float32, a packed multi-request pass and
a one-request `generate()` sum the same products in a different order (different matmul shapes
and attention blocking), so logits can differ in the last bits and a near-tie argmax may flip;
float64 makes such differences ~1e-16, far below any gap between two logits, so equality here
tests the engine's logic (positions, masks, cache slots), not the rounding of one kernel.
"""
import asyncio
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends.hf_engine import StepEngine  # noqa: E402
from batchlab.core.breakdown import finish  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.request import Request, Status  # noqa: E402
from batchlab.core.work import Step  # noqa: E402
from batchlab.run.driver import Inbox, drive  # noqa: E402
from batchlab.schedulers import ContinuousConfig  # noqa: E402
from batchlab.schedulers.continuous import ContinuousScheduler  # noqa: E402

# (prompt tokens, output tokens, step at which the request arrives)
MIX = [(5, 9, 0), (23, 6, 0), (40, 5, 2), (3, 14, 3), (17, 8, 3), (31, 7, 9)]


def make(mix, vocab=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [Request(f"r{i}", p, o, 0.0, index=i, prompt_token_ids=torch.randint(10, vocab, (p,), generator=g).tolist())
            for i, (p, o, _) in enumerate(mix)]


def reference(lm, r: Request) -> list[int]:
    """One request alone through generate(), configured like backends/hf.py (EOS suppressed)."""
    from transformers import GenerationConfig
    model, tok = lm
    n = r.max_new_tokens
    gen = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    ids = torch.tensor([r.prompt_token_ids])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    return out[0, ids.shape[1]:].tolist()


def step_by_hand(engine, scheduler, requests, arrive_at, windows=False, past_finishes=False):
    """The driver's loop with arrivals at given step numbers instead of times (deterministic)."""
    clock, k, steps = RealClock(), 0, []
    scheduler.windows, scheduler.finish_in_window = windows, windows and past_finishes

    async def main():
        nonlocal k
        while any(not r.is_done for r in requests):
            for r, at in zip(requests, arrive_at):
                if at == k:
                    scheduler.add(r)
            out = scheduler.schedule(clock.now())
            k += 1
            if not isinstance(out, Step):
                continue
            for r in out.preempted:
                engine.release(r)
            out.ran = await engine.step(out, clock)          # the driver's job: record what ran
            steps.extend([[(r.request_id, n) for r, n in out.chunks]] * out.ran)
            for r in scheduler.finish_step(out, clock.now()):
                engine.release(r)
                finish(r)                       # the driver's job: the scheduler only lets go
    clock.run(main())
    return steps


def drive_all_at_once(engine, scheduler, requests) -> None:
    """The real driver on a RealClock, every request arriving at its start."""
    clock = RealClock()

    async def main():
        t0 = clock.now()
        for r in requests:
            r.arrival_time = t0
        await drive(scheduler, engine, clock, Inbox(requests))
    clock.run(main())


def test_staggered_arrivals_match_generate_token_for_token(lm):
    reqs = make(MIX)
    engine = StepEngine(lm[0], lm[1])
    sched = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=1000)
    steps = step_by_hand(engine, sched, reqs, [a for *_, a in MIX])
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]
    assert all(r.output_len == r.max_new_tokens for r in reqs)
    # Prefills really were mixed with decodes: some step ran a prompt next to one-token rows.
    assert any(any(n > 1 for _, n in s) and any(n == 1 for _, n in s) for s in steps)
    assert engine.cache.slot_of == {}              # every finished request released its slot


def test_chunked_prefill_under_a_token_budget_matches_generate(lm):
    reqs = make(MIX, seed=1)
    engine = StepEngine(lm[0], lm[1])
    cfg = ContinuousConfig(block_size=4, chunk_size=6, max_num_batched_tokens=16)
    steps = step_by_hand(engine, ContinuousScheduler(cfg, num_kv_blocks=1000), reqs, [a for *_, a in MIX])
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]
    assert max(n for s in steps for _, n in s) == 6          # prompts really came in chunks
    assert max(sum(n for _, n in s) for s in steps) <= 16


def test_preempted_requests_recompute_and_still_match_generate_through_the_driver(lm):
    """The real driver on a RealClock; 18 blocks of 4 tokens cannot hold every sequence at once."""
    mix = [(12, 14, 0), (9, 16, 0), (14, 12, 0), (6, 18, 0), (10, 10, 0)]
    reqs = make(mix, seed=2)
    engine = StepEngine(lm[0], lm[1])
    sched = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=18)
    drive_all_at_once(engine, sched, reqs)
    assert sum(r.num_preemptions for r in reqs) >= 1
    assert [r.status for r in reqs] == [Status.FINISHED] * len(reqs)
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]
    assert engine.cache.slot_of == {}


@pytest.mark.parametrize("past_finishes", [False, True])
def test_decode_windows_run_several_passes_per_call_and_still_match_generate(lm, past_finishes):
    """The scheduler may offer k identical decode steps; the engine runs them in one worker call
    (a window offered past a request's last token stops there: every row runs every pass)."""
    reqs = make(MIX, seed=4)
    engine = StepEngine(lm[0], lm[1])
    sched = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=1000)
    offered = []
    real_step = engine.step

    async def spy(step, clock):
        offered.append(step.repeat)
        return await real_step(step, clock)
    engine.step = spy
    steps = step_by_hand(engine, sched, reqs, [a for *_, a in MIX], windows=True, past_finishes=past_finishes)
    assert max(offered) > 1 and len(offered) < len(steps)     # fewer calls than passes
    assert len(engine.step_log) == len(steps)                 # one record per pass
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]
    assert all(len(set(r.token_times)) == r.max_new_tokens for r in reqs)  # a stamp per pass


def test_step_log_accounts_for_every_token(lm):
    reqs = make(MIX[:4], seed=3)
    engine = StepEngine(lm[0], lm[1])
    steps = step_by_hand(engine, ContinuousScheduler(ContinuousConfig(chunk_size=8), 1000), reqs, [0, 0, 1, 1])
    log = engine.step_log
    assert len(log) == len(steps)
    assert sum(s.tokens for s in log) == sum(r.prompt_len + r.max_new_tokens - 1 for r in reqs)
    assert sum(s.emitted for s in log) == sum(r.max_new_tokens for r in reqs)
    assert [s.rows for s in log] == [len(s) for s in steps]
    assert all(s.duration > 0 for s in log)


def test_the_forward_pass_runs_off_the_event_loop(lm):
    """While a step computes, other coroutines (arrivals, a server) keep running."""
    r = make([(60, 1, 0)])[0]
    engine, clock, ticks = StepEngine(lm[0], lm[1]), RealClock(), []

    async def ticker(done: asyncio.Event):
        while not done.is_set():
            ticks.append(clock.now())
            await asyncio.sleep(0)

    async def main():
        done = asyncio.Event()
        t = asyncio.create_task(ticker(done))
        await asyncio.sleep(0)
        before = len(ticks)
        await engine.step(Step([(r, 60)]), clock)
        done.set()
        await t
        return before
    before = clock.run(main())
    assert len(ticks) > before and r.output_len == 1


def test_a_request_without_token_ids_is_refused_clearly(lm):
    r = Request("x", 4, 2, 0.0)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        RealClock().run(StepEngine(lm[0], lm[1]).step(Step([(r, 4)]), RealClock()))


def test_backend_efficiency_compares_achieved_with_what_the_step_time_allows():
    # Expectations from first principles, not from backend_efficiency's formula: a decode pass
    # of B rows takes t(B) and emits B tokens, so an engine that does nothing else emits B / t(B)
    # tokens/s; time spent otherwise lowers what it achieves in proportion.
    from batchlab.backends.hf_engine import StepRecord, backend_efficiency
    t = lambda rows: 0.001 + 0.0005 * rows                   # measured decode step time: t(10) = 6 ms
    busy = [StepRecord(i * t(10), t(10), 10, 10, 0, 10) for i in range(20)]
    wall = sum(r.duration for r in busy)                     # 0.12 s, 200 tokens
    assert backend_efficiency(busy, 200 / wall)["backend_eff"] == pytest.approx(1.0)
    assert backend_efficiency(busy, 200 / (2 * wall))["backend_eff"] == pytest.approx(0.5)   # idle half the time
    # one prefill pass as long as ten decode passes, emitting 10 first tokens: 10 decode passes
    # + the prefill = 110 tokens in the time of 20 decode passes, which could have emitted 200
    mixed = busy[:10] + [StepRecord(wall / 2, 10 * t(10), 10, 500, 500, 10)]
    achieved = 110 / sum(r.duration for r in mixed)
    out = backend_efficiency(mixed, achieved)
    assert out["backend_eff"] == pytest.approx(110 / 200) and out["occupancy"] == pytest.approx(10)
    prefill_only = [StepRecord(0.0, 0.01, 2, 50, 50, 2)]
    assert math.isnan(backend_efficiency(prefill_only, 100.0)["backend_eff"])    # nothing to fit


def test_a_sequence_past_a_sliding_window_is_refused_not_silently_attended_in_full():
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=8)
    engine = StepEngine(MistralForCausalLM(cfg).eval())
    fits = Request("a", 8, 1, 0.0, prompt_token_ids=list(range(3, 11)))
    RealClock().run(engine.step(Step([(fits, 8)]), RealClock()))
    assert fits.output_len == 1
    longer = Request("b", 12, 1, 0.0, prompt_token_ids=list(range(3, 15)))
    with pytest.raises(ValueError, match="sliding window"):
        RealClock().run(engine.step(Step([(longer, 12)]), RealClock()))


def test_step_breakdown_splits_the_window_into_model_passes_and_our_overhead():
    from batchlab.backends.hf_engine import StepRecord, step_breakdown
    # decode pass: 9 ms of a 10 ms step, 2 ms after the previous; prefill pass: 18 of 20 ms
    recs = [StepRecord(0.0, 0.010, 4, 4, 0, 4, 0.009, 5.0),           # its gap precedes the window
            StepRecord(0.012, 0.020, 4, 40, 36, 4, 0.018, 0.002),
            StepRecord(0.034, 0.010, 4, 4, 0, 4, 0.009, 0.002)]
    b = step_breakdown(recs)
    total = 0.040 + 0.004
    assert b["decode_frac"] == pytest.approx(0.018 / total) and b["prefill_frac"] == pytest.approx(0.018 / total)
    assert b["overhead_frac"] == pytest.approx(0.004 / total) and b["gap_frac"] == pytest.approx(0.004 / total)
    assert b["overhead_ms"] == pytest.approx(1.0) and b["gap_ms"] == pytest.approx(2.0)
    assert sum(b[k] for k in ("decode_frac", "prefill_frac", "overhead_frac", "gap_frac")) == pytest.approx(1.0)
    assert step_breakdown([StepRecord(0.0, 0.01, 1, 1, 0, 1)]) == {}      # records without pass times


def test_the_step_log_times_each_pass_and_the_gap_before_it(lm):
    engine = StepEngine(lm[0], lm[1])
    reqs = make(MIX[:3], seed=9)
    sched = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=1000)
    step_by_hand(engine, sched, reqs, [0, 0, 0], windows=True)
    log = engine.step_log
    assert all(0 < s.forward <= s.duration for s in log)
    assert log[0].gap == 0.0 and all(s.gap >= 0 for s in log)
    for a, b in zip(log, log[1:]):                  # a step starts where the previous ended, plus its gap
        assert b.start == pytest.approx(a.start + a.duration + b.gap, abs=1e-9)
