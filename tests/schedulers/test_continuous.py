import pytest

from batchlab.core.clock import VirtualClock
from batchlab.core.request import Request
from batchlab.core.work import Step
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import ContinuousConfig, ContinuousScheduler
from tests.fakes import UnitStepBackend, make_requests


def run(sched, reqs, backend=None):
    clock = VirtualClock()
    backend = backend or UnitStepBackend()
    clock.run(drive(sched, backend, clock, Inbox(reqs)))
    return backend


def test_token_budget_limits_admission_and_prefill_comes_whole():
    s = ContinuousScheduler(ContinuousConfig(max_num_batched_tokens=10), num_kv_blocks=100)
    s.add(Request("a", 6, 2, 0.0))
    s.add(Request("b", 6, 2, 0.0))
    step = s.schedule(0.0)
    assert [(r.request_id, n) for r, n in step.chunks] == [("a", 6)]


def test_chunked_prefill_splits_the_prompt_and_first_token_comes_after_the_last_chunk():
    s = ContinuousScheduler(ContinuousConfig(chunk_size=4), num_kv_blocks=100)
    r = Request("a", 10, 3, 0.0)
    run(s, [r])
    # 10 prompt tokens in chunks 4, 4, 2 (first token at the end of step 3), then 2 decodes.
    assert r.token_times == [3.0, 4.0, 5.0]


def test_kv_exhaustion_preempts_the_newest_and_it_recomputes():
    # 4 blocks of 4 tokens. a and b each hold 2 blocks after prefill of 5 tokens...
    cfg = ContinuousConfig(block_size=4, max_num_seqs=8)
    s = ContinuousScheduler(cfg, num_kv_blocks=4)
    a, b = Request("a", 5, 6, 0.0), Request("b", 5, 6, 0.0)
    backend = run(s, [a, b])
    assert a.status.value == b.status.value == "finished"
    assert a.output_len == b.output_len == 6
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert "b" in backend.released  # its KV was freed at preemption and at the end
    assert s.free_blocks == 4


def test_preempted_request_goes_back_to_the_front_with_no_computed_tokens():
    # 5 blocks of 2 tokens; a and b each need 4 blocks to finish (2 + 5 tokens): together they
    # outgrow the cache at their 5th token, and the newest (b) is preempted.
    s = ContinuousScheduler(ContinuousConfig(block_size=2), num_kv_blocks=5)
    a, b = Request("a", 2, 5, 0.0), Request("b", 2, 5, 0.0)
    s.add(a), s.add(b)
    for t in range(1, 10):
        step = s.schedule(float(t))
        if step.preempted:
            break
        for r, n in step.chunks:
            if r.num_computed_tokens + n >= r.num_tokens:
                r.stamp_token(float(t))
        s.finish_step(step, float(t))
    assert [r.request_id for r, _ in step.chunks] == ["a"] and step.preempted == [b]
    assert b.num_computed_tokens == 0 and s.waiting[0] is b and b.num_preemptions == 1
    assert s.blocks[a] == 3 and s.free_blocks == 2


def test_a_request_that_fits_its_prompt_but_not_its_output_fails_up_front():
    s = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=12)
    r = Request("long", 40, 20, 0.0)           # 60 tokens > 48: it could never finish
    run(s, [r])
    assert r.status.value == "failed" and "KV blocks" in r.error and not r.token_times


def test_reserve_policy_books_the_whole_output_and_never_preempts():
    cfg = ContinuousConfig(block_size=4, preemption="reserve")
    s = ContinuousScheduler(cfg, num_kv_blocks=4, policy="reserve")
    a, b = Request("a", 5, 6, 0.0), Request("b", 5, 6, 0.0)
    run(s, [a, b])
    assert a.num_preemptions == b.num_preemptions == 0
    assert b.scheduled_time >= a.completion_time  # b waited for a's blocks


def test_a_request_larger_than_the_whole_cache_fails_instead_of_hanging():
    s = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=2)
    big, ok = Request("big", 20, 2, 0.0), Request("ok", 2, 2, 0.0)
    run(s, [big, ok])
    assert big.status.value == "failed" and "KV blocks" in big.error
    assert ok.status.value == "finished"


def test_max_num_seqs_caps_the_running_set():
    s = ContinuousScheduler(ContinuousConfig(max_num_seqs=2), num_kv_blocks=100)
    for r in make_requests([0, 0, 0], [3, 3, 3]):
        s.add(r)
    step = s.schedule(0.0)
    assert isinstance(step, Step) and len(step.chunks) == 2 and len(s.waiting) == 1


def test_a_window_may_start_with_prefills_that_complete_their_prompts():
    s = ContinuousScheduler(ContinuousConfig(), num_kv_blocks=100, windows=True)
    s.add(Request("a", 4, 5, 0.0)), s.add(Request("b", 4, 3, 0.0))
    step = s.schedule(0.0)
    # both prompts whole in the first step, then decodes until b's last token
    assert [(r.request_id, n) for r, n in step.chunks] == [("a", 4), ("b", 4)] and step.repeat == 3


def test_no_window_starts_with_prefills_while_the_token_budget_holds_someone_back():
    s = ContinuousScheduler(ContinuousConfig(max_num_batched_tokens=10), num_kv_blocks=100, windows=True)
    s.add(Request("a", 6, 5, 0.0)), s.add(Request("b", 6, 5, 0.0))
    step = s.schedule(0.0)
    # b fits in the next step, once a's prompt no longer takes the budget
    assert [(r.request_id, n) for r, n in step.chunks] == [("a", 6)] and step.repeat == 1


def test_with_nobody_waiting_a_window_runs_past_finishes():
    s = ContinuousScheduler(ContinuousConfig(), num_kv_blocks=100, policy="reserve", windows=True, finish_in_window=True)
    s.add(Request("a", 4, 5, 0.0)), s.add(Request("b", 4, 3, 0.0))
    assert s.schedule(0.0).repeat == 5         # to a's last token; b leaves after its third


@pytest.mark.parametrize("waiting_out, repeat", [(4, 4), (20, 8)])
def test_a_window_ends_at_the_finish_that_frees_room_for_the_head_of_the_queue(waiting_out, repeat):
    # blocks of 4 tokens, booked whole under reserve: a holds 2, b 3, 1 of 6 is free; a's finish
    # (after 4 tokens) frees 2, b's (after 8) 3 more. c needs 2 blocks (fits after a) or 6 (after b).
    s = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=6, policy="reserve", windows=True,
                            finish_in_window=True)
    for r in (Request("a", 4, 4, 0.0), Request("b", 4, 8, 0.0), Request("c", 4, waiting_out, 0.0)):
        s.add(r)
    step = s.schedule(0.0)
    assert [r.request_id for r, _ in step.chunks] == ["a", "b"] and step.repeat == repeat
