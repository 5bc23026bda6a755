"""Production trace formats: each test writes a small file in the format, as published."""
import json
import subprocess
import sys

import pytest

from batchlab.core.config import TrafficConfig
from batchlab.core.content import ideal_prefix_hits, token_ids
from batchlab.core.trace_formats import azure_ticks, detect_format, read_trace
from batchlab.core.traffic import build_trace, check_inputs
from batchlab.errors import ConfigError

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:47.1805900,396,109
2023-11-16 18:15:47.9305901,879,0
2023-11-16 18:15:48.9305900,1024,57
"""

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,Conversation log
130,ChatGPT,1360,138,1498,API log
134.5,ChatGPT,300,20,320,Conversation log
"""


def mooncake_rows():
    return [{"timestamp": 27482, "input_length": 1200, "output_length": 10, "hash_ids": [46, 47, 48]},
            {"timestamp": 30535, "input_length": 1100, "output_length": 20, "hash_ids": [46, 47, 49]},
            {"timestamp": 30000, "input_length": 600, "output_length": 30, "hash_ids": [46, 50]}]


def write(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text)
    return f


def replay(f, **kw):
    return TrafficConfig(arrival="trace", trace_file=str(f), replay=kw or None)


def test_azure_is_replayed_relative_to_its_first_request_with_7_digit_fractions(tmp_path):
    f = write(tmp_path, "azure.csv", AZURE)
    assert detect_format(f) == "azure"
    r = read_trace(replay(f))
    assert [i.arrival for i in r.items] == [0.0, 0.5, 2.25]      # exact: integer 100 ns ticks
    assert [(i.prompt_len, i.output_len) for i in r.items] == [(374, 44), (396, 109), (1024, 57)]
    assert r.warnings == [f"{f}: skipped 1 of 4 rows with a zero-length prompt or output"]


@pytest.mark.parametrize("text,ticks", [("2023-11-16 18:15:46", 17001585460000000),
                                        ("2023-11-16T18:15:46Z", 17001585460000000),
                                        ("2023-11-16 20:15:46+02:00", 17001585460000000), ("12.5", 125000000),
                                        ("2023-11-16 18:15:46.123456789", 17001585461234567)])
def test_azure_timestamps_parse_in_every_spelling(text, ticks):
    assert azure_ticks(text, "x") == ticks             # 100 ns ticks since 1970, UTC


@pytest.mark.parametrize("cell,message", [("2023-13-01 00:00:00", "not a valid date"), ("yesterday", "non-negative number"),
                                          ("-1", "non-negative number"), ("nan", "non-negative number")])
def test_a_bad_azure_timestamp_names_the_file_and_line(tmp_path, cell, message):
    f = write(tmp_path, "azure.csv", AZURE + f"{cell},10,10\n")
    with pytest.raises(ConfigError, match=rf"^{f}:6: TIMESTAMP .*{message}"):
        read_trace(replay(f))


def test_window_then_time_scale(tmp_path):
    f = write(tmp_path, "azure.csv", AZURE)
    r = read_trace(replay(f, start_s=0.5, duration_s=2, time_scale=2.0))
    assert [i.arrival for i in r.items] == [0.0, 3.5]            # 0.5 s -> 0; 2.25 s -> (2.25 - 0.5) x 2
    with pytest.raises(ConfigError, match="no requests in the window"):
        read_trace(replay(f, start_s=100))


def test_rows_out_of_time_order_are_replayed_sorted_with_a_warning(tmp_path):
    lines = AZURE.splitlines()
    f = write(tmp_path, "azure.csv", "\n".join([lines[0], lines[4], lines[1], lines[2]]) + "\n")
    r = read_trace(replay(f))
    assert [i.prompt_len for i in r.items] == [374, 396, 1024]
    assert r.items[0].arrival == 0.0 and r.items[-1].arrival == 2.25
    assert any("replayed in time order" in w for w in r.warnings)


def test_burstgpt_filters_by_model_and_log_type(tmp_path):
    f = write(tmp_path, "burst.csv", BURSTGPT)
    assert detect_format(f) == "burstgpt"
    everything = read_trace(replay(f))
    assert [i.prompt_len for i in everything.items] == [472, 417, 1360, 300]   # the 0-token response is skipped
    chat = read_trace(replay(f, model="chatgpt", log_type="Conversation log"))
    assert [(i.arrival, i.prompt_len, i.output_len) for i in chat.items] == [(0.0, 472, 18), (129.5, 300, 20)]
    with pytest.raises(ConfigError, match="no rows match .*GPT-5.*the file has Model: ChatGPT, GPT-4"):
        read_trace(replay(f, model="GPT-5"))


def test_mooncake_hash_ids_become_shared_token_blocks(tmp_path):
    f = write(tmp_path, "mc.jsonl", "\n".join(json.dumps(r) for r in mooncake_rows()) + "\n")
    assert detect_format(f) == "mooncake"
    items = read_trace(replay(f)).items
    assert [i.arrival for i in items] == [0.0, 2.518, 3.053]    # sorted by timestamp, ms -> s
    ids = [token_ids(i.content, 32000) for i in items]
    assert [len(x) for x in ids] == [i.prompt_len for i in items] == [1200, 600, 1100]
    first, short, second = ids
    assert first[:1024] == second[:1024] and first[1024:1100] != second[1024:1100]   # blocks 46, 47 shared
    assert short[:512] == first[:512] and short[512:] != first[512:600]             # block 46 shared, 50 not
    assert all(10 <= t < 32000 for x in ids for t in x)
    # an unbounded cache of 16-token blocks: the second request finds block 46 (32 blocks), the
    # third blocks 46 and 47 (64); nothing else is shared
    assert ideal_prefix_hits(ids, 16) == (32 + 64, 1200 // 16 + 600 // 16 + 1100 // 16)
    other_seed = TrafficConfig(arrival="trace", trace_file=str(f), seed=1)
    assert token_ids(read_trace(other_seed).items[0].content, 32000) != first


def test_mooncake_block_size_is_a_setting_and_checked(tmp_path):
    rows = [{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]}]
    f = write(tmp_path, "mc.jsonl", json.dumps(rows[0]) + "\n")
    with pytest.raises(ConfigError, match=rf"^{f}:1: 3 hash_ids for input_length 40, which is 1 blocks of .*block_size 512"):
        read_trace(replay(f))
    items = read_trace(replay(f, block_size=16)).items
    assert [n for _, n in items[0].content] == [16, 16, 8]       # the last block is partial


@pytest.mark.parametrize("line,message", [
    ("not json", "not a JSON object"), ("[1, 2]", "expected a JSON object"),
    ('{"timestamp": 1, "input_length": 10}', "missing output_length"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 1}', "timestamp must be a non-negative number"),
    ('{"timestamp": 1, "input_length": 1.5, "output_length": 1}', "input_length must be a whole number"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}', "hash_ids must be a list"),
])
def test_a_bad_mooncake_line_names_the_file_and_line(tmp_path, line, message):
    good = json.dumps(mooncake_rows()[0])
    f = write(tmp_path, "mc.jsonl", f"{good}\n\n{line}\n")
    with pytest.raises(ConfigError, match=rf"^{f}:3: .*{message}"):
        read_trace(replay(f, format="mooncake"))


def test_an_unknown_header_asks_for_the_format(tmp_path):
    f = write(tmp_path, "x.csv", "time,in,out\n1,2,3\n")
    with pytest.raises(ConfigError, match="cannot tell the trace format .* set traffic.replay.format"):
        read_trace(replay(f))
    with pytest.raises(ConfigError, match="missing column.*for format 'azure'"):
        read_trace(replay(f, format="azure"))


def test_the_per_point_caps_apply_to_the_window(tmp_path, monkeypatch):
    import batchlab.core.trace_formats as formats
    f = write(tmp_path, "azure.csv", AZURE)
    monkeypatch.setattr(formats, "MAX_REQUESTS_PER_POINT", 2)
    with pytest.raises(ConfigError, match="3 requests in the window; a point may have at most 2"):
        read_trace(replay(f))
    assert len(read_trace(replay(f, duration_s=1)).items) == 2
    monkeypatch.setattr(formats, "MAX_TRACE_ROWS", 3)
    with pytest.raises(ConfigError, match=rf"^{f}:5: more than 3 rows"):
        read_trace(replay(f))


def test_build_trace_and_check_inputs_use_the_format(tmp_path):
    f = write(tmp_path, "burst.csv", BURSTGPT)
    t = replay(f, log_type="API log")
    assert [i.prompt_len for i in build_trace(t, 1.0)] == [1360]
    assert check_inputs(t) == []
    assert check_inputs(replay(f)) == [f"{f}: skipped 1 of 5 rows with a zero-length prompt or output"]


def batchlab(*args):
    return subprocess.run([sys.executable, "-m", "batchlab.cli", *args], capture_output=True, text=True)


def test_the_cli_replays_a_production_trace_and_refuses_a_bad_row_before_writing(tmp_path):
    f = write(tmp_path, "azure.csv", AZURE)
    out = tmp_path / "out"
    p = batchlab("run", "--out", str(out), "--quiet", "--set", "traffic.arrival=trace", "--set", f"traffic.trace_file={f}",
                 "--set", "traffic.warmup_s=0", "--set", "strategies=[continuous]")
    assert p.returncode == 0, p.stderr
    assert "warning:" in p.stderr and "skipped 1 of 4 rows" in p.stderr
    assert len((out / "requests.csv").read_text().splitlines()) == 1 + 3
    bad = write(tmp_path, "bad.csv", AZURE + "2023-11-16 18:15:49,ten,5\n")
    p = batchlab("run", "--out", str(tmp_path / "out2"), "--quiet", "--set", "traffic.arrival=trace",
                 "--set", f"traffic.trace_file={bad}")
    assert p.returncode == 2 and p.stderr.strip() == f"error: {bad}:6: ContextTokens must be a whole number of tokens from 0 to 1048576 (got 'ten')"
    assert not (tmp_path / "out2").exists()
