import json

import numpy as np
import pytest

from batchlab.core.config import TrafficConfig
from batchlab.core.traffic import build_trace, read_trace_file
from batchlab.errors import ConfigError


def cfg(**kw):
    base = dict(duration_s=2000, warmup_s=0, seed=3)
    return TrafficConfig.model_validate(base | kw)


def test_same_seed_same_trace_other_seed_other_trace():
    a = build_trace(cfg(), 5.0)
    assert a == build_trace(cfg(), 5.0)
    assert a != build_trace(cfg(seed=4), 5.0)
    assert a != build_trace(cfg(), 5.0, repeat=1)


@pytest.mark.parametrize("arrival,shape,cv", [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0),
                                              ("gamma", 4.0, 0.5), ("constant", 1.0, 0.0)])
def test_rate_and_burstiness(arrival, shape, cv):
    t = np.array([i.arrival for i in build_trace(cfg(arrival=arrival, burstiness=shape), 10.0)])
    gaps = np.diff(t)
    assert abs(len(t) / 2000 - 10.0) < 0.5
    assert abs(gaps.std() / gaps.mean() - cv) < 0.1


def test_length_distributions():
    tr = build_trace(cfg(prompt_len={"dist": "uniform", "low": 50, "high": 300},
                         output_len={"dist": "lognormal", "median": 100, "sigma": 0.5, "low": 10, "high": 400}), 5.0)
    p = np.array([i.prompt_len for i in tr])
    o = np.array([i.output_len for i in tr])
    assert p.min() >= 50 and p.max() <= 300 and abs(p.mean() - 175) < 5
    assert o.min() >= 10 and o.max() <= 400 and abs(np.median(o) - 100) < 5


def test_rate_step_switches_rate():
    tr = build_trace(cfg(rate_step={"at_s": 1000, "to_rate": 40}), 10.0)
    t = np.array([i.arrival for i in tr])
    assert abs((t < 1000).sum() / 1000 - 10) < 1 and abs((t >= 1000).sum() / 1000 - 40) < 2


def test_sharegpt_lengths_and_texts(tmp_path):
    data = [{"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "a b"}]},
            {"conversations": [{"from": "human", "value": "x " * 10}, {"from": "gpt", "value": "y " * 7}]}]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data))
    tr = build_trace(cfg(duration_s=50, prompt_len={"dist": "sharegpt", "path": str(f)},
                         output_len={"dist": "sharegpt", "path": str(f)}), 2.0)
    assert {i.prompt_len for i in tr} <= {3, 10} and {i.output_len for i in tr} <= {2, 7}
    assert all(i.prompt for i in tr)


def test_trace_file_replay(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_time,prompt_len,output_len\n0.5,10,3\n0.1,20,4\n")
    tr = build_trace(cfg(arrival="trace", trace_file=str(f)), 1.0)
    assert [(i.arrival, i.prompt_len, i.output_len) for i in tr] == [(0.1, 20, 4), (0.5, 10, 3)]


def test_bad_trace_file_says_where(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_time,prompt_len,output_len\n0.5,ten,3\n")
    with pytest.raises(ConfigError, match=r"t.csv:2"):
        read_trace_file(str(f))
    with pytest.raises(ConfigError, match="not found"):
        read_trace_file(str(tmp_path / "missing.csv"))
