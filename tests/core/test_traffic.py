import json

import numpy as np
import pytest

from batchlab.core.config import TrafficConfig
from batchlab.core.limits import MAX_LENGTH
from batchlab.core.traffic import build_trace, check_inputs, read_trace_file
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


HEADER = "arrival_time,prompt_len,output_len\n"


@pytest.mark.parametrize("row,message", [
    ("nan,10,5", "arrival_time must be a number of seconds from 0 to 604800 (got 'nan')"),
    ("inf,10,5", "arrival_time must be a number of seconds"),
    ("-1,10,5", "arrival_time must be a number of seconds"),
    ("1e9,10,5", "arrival_time must be a number of seconds"),
    ("0.2,10", "missing output_len"),
    ("0.2,,5", "missing prompt_len"),
    ("a,b,c", "arrival_time must be a number of seconds"),
    ("0.2,0,5", "prompt_len must be a whole number of tokens from 1 to 1048576 (got '0')"),
    ("0.2,10,2.5", "output_len must be a whole number of tokens"),
    ("0.2,10,-3", "output_len must be a whole number of tokens"),
    ("0.2,10,99999999", "output_len must be a whole number of tokens from 1 to 1048576"),
    ("0.2,10,5,extra", "more cells than the header has"),
])
def test_every_trace_row_is_checked_and_named_by_file_and_line(tmp_path, row, message):
    f = tmp_path / "t.csv"
    f.write_text(HEADER + "0.1,10,5\n" + row + "\n")
    with pytest.raises(ConfigError) as e:
        read_trace_file(str(f))
    assert str(e.value).startswith(f"{f}:3: ") and message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text,message", [
    ("", "the file is empty"),
    (HEADER, "no rows after the header"),
    ("0.1,10,5\n0.2,10,5\n", "missing column(s) arrival_time, prompt_len, output_len (the first line must be the header"),
    ("time,prompt_len,output_len\n0.1,10,5\n", "missing column(s) arrival_time"),
])
def test_empty_headerless_and_header_only_traces_are_refused(tmp_path, text, message):
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_trace_file(str(f))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_trace_with_a_byte_order_mark_and_spaced_header_reads(tmp_path):
    f = tmp_path / "t.csv"
    f.write_bytes(b"\xef\xbb\xbfarrival_time, prompt_len ,output_len,prompt\n0.5,10,3,hi\n0.1,20,4,\n")
    tr = read_trace_file(str(f))
    assert [(i.arrival, i.prompt_len, i.output_len, i.prompt) for i in tr] == [(0.1, 20, 4, ""), (0.5, 10, 3, "hi")]


def test_a_trace_that_is_not_text_is_refused(tmp_path):
    f = tmp_path / "t.csv"
    f.write_bytes(HEADER.encode() + b"0.1,10,\xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_trace_file(str(f))


def test_a_trace_longer_than_the_cap_is_refused(tmp_path, monkeypatch):
    import batchlab.core.trace_formats as traffic  # where trace files are read
    monkeypatch.setattr(traffic, "MAX_REQUESTS_PER_POINT", 3)
    f = tmp_path / "t.csv"
    f.write_text(HEADER + "0.1,1,1\n" * 4)
    with pytest.raises(ConfigError, match="more than 3 rows"):
        read_trace_file(str(f))
    monkeypatch.setattr(traffic, "MAX_TOKENS_PER_POINT", 5)
    f.write_text(HEADER + "0.1,2,2\n" * 2)
    with pytest.raises(ConfigError, match="8 prompt \\+ output tokens; a point may have at most 5"):
        read_trace_file(str(f))


def sharegpt(tmp_path, data, raw: str | None = None):
    import batchlab.core.traffic as traffic
    traffic._sharegpt_turns.cache_clear()
    f = tmp_path / "sg.json"
    f.write_text(raw if raw is not None else json.dumps(data))
    return cfg(duration_s=10, prompt_len={"dist": "sharegpt", "path": str(f)})


@pytest.mark.parametrize("data,raw,message", [
    (None, "{not json", "not valid JSON"),
    ({"conversations": []}, None, "expected a JSON list of conversations"),
    ([{"conversations": [{"from": "human", "value": "hi"}]}, {"id": 3}], None, "conversation 1: expected an object"),
    ([{"conversations": ["hi"]}], None, "conversation 0, turn 0: expected an object"),
    ([{"conversations": [{"from": "gpt", "value": "hi"}]}], None, "no 'human' turns found"),
    ([], None, "no 'human' turns found"),
])
def test_bad_sharegpt_files_fail_in_one_line(tmp_path, data, raw, message):
    c = sharegpt(tmp_path, data, raw)
    with pytest.raises(ConfigError) as e:
        check_inputs(c)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_check_inputs_applies_the_token_cap_with_the_files_real_lengths(tmp_path, monkeypatch):
    import batchlab.core.limits as limits
    c = sharegpt(tmp_path, [{"conversations": [{"from": "human", "value": "w " * 1000}]}])
    check_inputs(c)                       # 5 req/s x 10 s x (1000 + 128) tokens: well under the cap
    monkeypatch.setattr(limits, "MAX_TOKENS_PER_POINT", 40_000)
    with pytest.raises(ConfigError, match="about 5.64e\\+04 prompt \\+ output tokens"):
        check_inputs(c)


def test_lognormal_without_high_is_clipped_at_the_length_bound():
    tr = build_trace(cfg(duration_s=20, rates=[5], prompt_len={"dist": "lognormal", "median": 500_000, "sigma": 10}), 5.0)
    assert max(i.prompt_len for i in tr) == MAX_LENGTH and min(i.prompt_len for i in tr) >= 1
