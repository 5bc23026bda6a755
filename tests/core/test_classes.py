"""traffic.classes: a weighted mix of classes (and fixed-rate ones), each with its own lengths,
tenant and priority; plain traffic is untouched by the feature."""
from collections import Counter

import pytest

from batchlab.core.traffic import build_trace, make_requests
from batchlab.errors import ConfigError
from batchlab.run.config import load_config
from batchlab.run.experiment import config_tree

MIX = ("traffic.classes=[{name: chat, weight: 3, output_len: 16, tenant: alice, priority: 0},"
       " {name: batch, weight: 1, output_len: {dist: uniform, low: 200, high: 400}, priority: 2}]")


def trace(*sets, rate=40.0, repeat=0):
    cfg = load_config(None, ["traffic.duration_s=100", "traffic.warmup_s=0", *sets])
    return cfg, build_trace(cfg.traffic, rate, repeat)


def test_classes_split_the_rate_by_weight_with_their_own_lengths():
    _, items = trace(MIX)
    n = Counter(i.klass for i in items)
    assert abs(n["chat"] / len(items) - 0.75) < 0.03 and 3600 < len(items) < 4400
    assert {i.output_len for i in items if i.klass == "chat"} == {16}
    assert all(200 <= i.output_len <= 400 for i in items if i.klass == "batch")
    assert {(i.tenant, i.priority) for i in items} == {("alice", 0), ("batch", 2)}   # tenant defaults to the name
    assert [i.arrival for i in items] == sorted(i.arrival for i in items)


def test_a_class_with_its_own_rate_is_a_fixed_background_whatever_the_point_rate():
    bg = ("traffic.classes=[{name: fg, weight: 1}, {name: bg, rate: 2}]")
    for rate in (5.0, 50.0):
        _, items = trace(bg, rate=rate)
        n = Counter(i.klass for i in items)
        assert abs(n["bg"] - 200) < 50 and abs(n["fg"] - 100 * rate) < 5 * (100 * rate) ** 0.5


def test_same_seed_same_trace_and_classes_reach_the_requests():
    cfg, a = trace(MIX)
    _, b = trace(MIX)
    assert a == b
    reqs = make_requests(a, 0.0)
    assert [(r.klass, r.tenant, r.priority) for r in reqs] == [(i.klass, i.tenant, i.priority) for i in a]


def test_plain_traffic_is_unchanged_by_the_feature():
    _, plain = trace()
    assert all(i.klass is None for i in plain)
    cfg = load_config(None, [])
    assert "classes" not in config_tree(cfg)["traffic"]


@pytest.mark.parametrize("value, message", [
    ("[{name: a, weight: 1}, {name: a, weight: 2}]", "each class name may be used once"),
    ("[{name: a, weight: 1, rate: 2}]", "give exactly one of weight"),
    ("[{name: 'a b', weight: 1}]", "classes.0.name"),
    ("[]", "classes"),
])
def test_bad_classes_are_one_line(value, message):
    with pytest.raises(ConfigError, match="classes") as e:
        load_config(None, [f"traffic.classes={value}"])
    assert message in str(e.value)


def test_classes_and_sessions_do_not_mix():
    with pytest.raises(ConfigError, match="cannot be combined with sessions"):
        load_config(None, [MIX, "traffic.sessions={turns: 2}"])
