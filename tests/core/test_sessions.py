"""Shared-prefix and session traffic as planned (core/traffic.py, core/sessions.py): what the
trace holds before anything runs, and how a session's next turn is made from the previous one."""
from collections import Counter

import numpy as np
import pytest

from batchlab.core.config import TrafficConfig
from batchlab.core.content import id_range, ideal_prefix_hits, segment_ids, token_ids
from batchlab.core.request import Request, Status
from batchlab.core.sessions import Conversations
from batchlab.core.traffic import build_trace, make_requests, zipf_groups
from batchlab.errors import ConfigError
from batchlab.run.config import load_config
from batchlab.run.experiment import identity

BASE = dict(duration_s=200, warmup_s=0, seed=3, prompt_len={"dist": "uniform", "low": 10, "high": 50},
            output_len={"dist": "uniform", "low": 4, "high": 9})


def traffic(**kw):
    return TrafficConfig.model_validate(BASE | kw)


def test_prefix_and_sessions_keep_the_plain_traces_arrivals_and_lengths():
    plain = build_trace(traffic(), 2.0)
    shared = build_trace(traffic(prefix={"groups": 3, "tokens": 100}, sessions={"turns": 3}), 2.0)
    assert [i.arrival for i in shared] == [i.arrival for i in plain]
    assert [i.output_len for i in shared] == [i.output_len for i in plain]
    assert [i.prompt_len for i in shared] == [i.prompt_len + 100 for i in plain]
    assert all(sum(n for _, n in i.content) == i.prompt_len for i in shared)


def test_requests_of_a_group_share_exactly_its_system_prompt():
    trace = build_trace(traffic(prefix={"groups": 3, "tokens": 100, "zipf": 0}), 2.0)
    reqs = make_requests(trace, 0.0, vocab=3000)
    by_group: dict[int, list[Request]] = {}
    for r in reqs:
        assert len(r.prompt_token_ids) == r.prompt_len and all(10 <= t < 3000 for t in r.prompt_token_ids)
        by_group.setdefault(r.prefix_group, []).append(r)
    assert set(by_group) == {0, 1, 2}
    heads = {g: {tuple(r.prompt_token_ids[:100]) for r in rs} for g, rs in by_group.items()}
    assert all(len(h) == 1 for h in heads.values()) and len({h.pop() for h in heads.values()}) == 3
    assert len({tuple(r.prompt_token_ids[100:]) for r in reqs}) == len(reqs)     # every message its own


def test_an_unbounded_cache_would_find_every_repeat_of_a_system_prompt():
    trace = build_trace(traffic(prefix={"groups": 3, "tokens": 96, "zipf": 1.0}), 2.0)
    reqs = make_requests(trace, 0.0, vocab=32000)
    hits, total = ideal_prefix_hits([r.prompt_token_ids for r in reqs], 16)
    groups = {r.prefix_group for r in reqs}
    assert hits == (len(reqs) - len(groups)) * 96 // 16          # messages never repeat
    assert total == sum(r.prompt_len // 16 for r in reqs)


def test_zipf_popularity_follows_the_exponent():
    rng = np.random.default_rng(0)
    counts = Counter(zipf_groups(4, 1.0, 40_000, rng))
    expected = np.array([1, 1 / 2, 1 / 3, 1 / 4]) / sum([1, 1 / 2, 1 / 3, 1 / 4])
    assert np.allclose([counts[g] / 40_000 for g in range(4)], expected, atol=0.01)
    assert set(zipf_groups(1, 2.0, 50, rng)) == {0}


def test_token_ids_are_deterministic_prefix_consistent_and_key_specific():
    a = token_ids(((("k", 1), 40),), 3000)
    assert a == token_ids(((("k", 1), 40),), 3000)
    assert a[:17] == segment_ids(("k", 1), 17, 3000).tolist()          # a shorter block is a prefix
    assert a != token_ids(((("k", 2), 40),), 3000)
    assert id_range(None) == (10, 1100) and id_range(128_256) == (10, 32_000)
    with pytest.raises(ValueError):
        id_range(5)


def test_sessions_plan_every_later_turn_with_the_trace():
    t = traffic(sessions={"turns": 4, "think_s": 2.0, "think": "fixed", "message_len": 7})
    trace = build_trace(t, 1.0)
    assert all(len(i.session) == 3 for i in trace)
    assert {f.think_s for i in trace for f in i.session} == {2.0}
    assert {f.message[1] for i in trace for f in i.session} == {7}
    assert build_trace(t, 1.0) == trace and build_trace(t, 1.0, repeat=1) != trace


def conversation(turns=3, think=0.5, prepare=None, end_s=100.0):
    trace = build_trace(traffic(sessions={"turns": turns, "think_s": think, "think": "fixed", "message_len": 5},
                                duration_s=3), 1.0)[:1]
    first = make_requests(trace, 10.0, vocab=3000)
    return first[0], Conversations(trace, first, 10.0, end_s, 3000, prepare)


def answer(r: Request, at: float, ids=None):
    r.token_times = [at - 0.1 * k for k in range(r.max_new_tokens)][::-1]
    r.output_token_ids = list(ids or [])
    r.status = Status.FINISHED


def test_the_next_turn_resends_the_conversation_think_time_after_the_answer():
    first, talk = conversation()
    answer(first, 12.0, ids=[7] * first.max_new_tokens)
    second = talk.next_turn(first)
    assert second.arrival_time == 12.5 and (second.session_id, second.turn) == (0, 2)
    assert second.request_id == "r000000-t2"
    assert second.prompt_token_ids[:first.prompt_len + first.output_len] == first.prompt_token_ids + [7] * first.output_len
    assert second.prompt_len == len(second.prompt_token_ids) == first.prompt_len + first.output_len + 5
    answer(second, 20.0)                                # no ids (the simulator): placeholders stand in
    third = talk.next_turn(second)
    assert third.prompt_token_ids[:second.prompt_len] == second.prompt_token_ids
    held = third.prompt_token_ids[second.prompt_len:second.prompt_len + second.output_len]
    assert len(held) == second.output_len and all(10 <= t < 3000 for t in held)
    answer(third, 30.0)
    assert talk.next_turn(third) is None and talk.ended == Counter(done=1)
    assert [r.turn for r in talk.requests()] == [1, 2, 3]


def test_a_failed_turn_ends_its_session_and_a_late_one_is_cut():
    first, talk = conversation()
    first.fail("boom")
    assert talk.next_turn(first) is None and talk.ended == Counter(failed=1)
    first, talk = conversation(end_s=2.4)                # the run's traffic ends 2.4 s after t0 = 10
    answer(first, 12.0)
    assert talk.next_turn(first) is None and talk.ended == Counter(cut=1)


def test_a_turn_the_backend_refuses_is_kept_failed_and_ends_the_session():
    def short_context(r):
        if r.prompt_len > 20:
            raise ValueError("too long")
    first, talk = conversation(prepare=short_context)
    answer(first, 12.0)
    assert talk.next_turn(first) is None
    assert talk.later[0].status is Status.FAILED and talk.later[0].error == "invalid request: too long"
    assert talk.ended == Counter(failed=1)


@pytest.mark.parametrize("sets,message", [
    (["backend.kind=openai", "strategies=[server]", "backend.base_url=http://x:1/v1", "traffic.sessions={turns: 2}"],
     "traffic.sessions: not supported with backend.kind 'openai'"),
    (["traffic.arrival=trace", "traffic.trace_file=x.csv", "traffic.prefix={groups: 2}"], "traffic: prefix makes synthetic traffic"),
    (["traffic.prefix={tokens: 1048576}"], "traffic.prefix.tokens"),
    (["traffic.sessions={turns: 0}"], "traffic.sessions.turns"),
])
def test_combinations_that_cannot_work_are_refused_in_one_line(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets)


def test_unset_traffic_keys_stay_out_of_identities_so_old_digests_hold():
    tree = identity(load_config(None, []))["traffic"]
    assert not {"replay", "prefix", "sessions"} & set(tree)
    assert "sessions" in identity(load_config(None, ["traffic.sessions={turns: 2}"]))["traffic"]


def test_the_request_cap_counts_every_turn():
    with pytest.raises(ConfigError, match="requests per point"):
        load_config(None, ["traffic.rates=[1000]", "traffic.duration_s=600", "traffic.sessions={turns: 2}"])
    load_config(None, ["traffic.rates=[1000]", "traffic.duration_s=600"])
