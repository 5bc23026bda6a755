"""Property tests (hypothesis) over everything a user types or hands in: configs, `--set`
values, trace CSV files, ShareGPT files.

One property throughout: an input is either accepted, and then every number in it is finite and
within the stated bounds (and a small trace built from it is well formed), or refused with a
ConfigError of one line; never another exception, never a hang (the per-point caps bound the
work), and through the CLI a refused input exits 2 with one `error:` line and writes nothing.
Derandomized with fixed example counts, so CI runs the same cases every time (~20 s here).
Run with `--hypothesis-show-statistics` to see how many cases each test generated.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
import typing
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from batchlab.core.config import RunConfig, TrafficConfig
from batchlab.core.limits import MAX_LENGTH, MAX_RATE, MAX_REQUESTS_PER_POINT, MAX_SECONDS, MAX_TOKENS_PER_POINT, MIN_RATE
from batchlab.core.traffic import build_trace, check_inputs, read_trace_file
from batchlab.errors import ConfigError
from batchlab.run.config import config_warnings, load_config, load_user_config

FUZZ = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
pytestmark = pytest.mark.timeout(300)     # "never a hang": a generous bound on the whole test
_names = itertools.count()


def config_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree (sections and leaves)."""
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                keys += config_keys(arg, f"{prefix}{name}.")
    return keys


KEYS = config_keys()
NASTY = [0, -1, 1, 0.5, 1e9, 1e300, -1e-300, 5e-324, 2**63, 2**64, -(2**70), "inf", "nan", ".inf", "-.inf",
         ".nan", "1e9", "1e400", "", " ", "tiny", "auto", "cpu", "cuda:0", "poisson", "gamma", "trace",
         "sim", "hf", "hf-cb", "openai", "server", "naive", "fixed", "uniform", "lognormal", "sharegpt",
         "http://127.0.0.1:9/v1", "sk-123", True, False, None]
scalars = st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.sampled_from(NASTY), st.text(max_size=12))
# Plausible values, so that a good share of the generated inputs is accepted and checked for sanity.
plausible = st.one_of(st.integers(1, 5000), st.floats(0.001, 2000), st.lists(st.floats(0.01, 2000), min_size=1, max_size=3),
                      st.sampled_from(["poisson", "gamma", "constant", "sim", "toy", "naive", "continuous", "recompute",
                                       "reserve", "round_robin", "least_outstanding", "auto", "cpu", "float32", "text"]),
                      st.fixed_dictionaries({"dist": st.sampled_from(["uniform", "lognormal"]), "low": st.integers(1, 50),
                                             "high": st.integers(50, 5000), "median": st.floats(1, 3000),
                                             "sigma": st.floats(0.01, 10)}))
values = st.one_of(scalars, plausible, st.lists(scalars, max_size=4),
                   st.dictionaries(st.sampled_from(["dist", "value", "low", "high", "median", "sigma", "path",
                                                    "at_s", "to_rate", "until_s", "x"]), scalars, max_size=4))
keys = st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS).map(lambda k: k + ".x"),
                 st.text(st.characters(codec="utf-8"), min_size=1, max_size=12))


def typed(key: str) -> st.SearchStrategy:
    """Values of the right type for `key`, on both sides of its bounds: these reach the checks
    behind the type check (bounds, per-point caps) far more often than random values."""
    name = key.split(".")[-1]
    field = _field(key)
    literal = [a for a in [field.annotation, *typing.get_args(field.annotation)] if typing.get_origin(a) is typing.Literal]
    if literal:
        return st.sampled_from(typing.get_args(literal[0]))
    if name == "rates":
        return st.lists(st.floats(1e-7, 2e5), min_size=1, max_size=3)
    if name in ("prompt_len", "output_len"):
        return st.integers(0, 2 * MAX_LENGTH) | plausible.filter(lambda v: isinstance(v, dict))
    if name == "rate_step":
        return st.fixed_dictionaries({"at_s": st.floats(0, 1e6), "to_rate": st.floats(0, 2e5)},
                                     optional={"until_s": st.floats(0, 1e6)})
    if name.endswith(("_s", "_ms", "rate", "burstiness", "median", "sigma")):
        return st.floats(-1, 2e6) | st.sampled_from([0.0, 1e-9, 0.01, 1e5, 1e6])
    if name in ("seed", "memory_budget_bytes"):
        return st.integers(-5, 2**65)
    if name in ("kind", "preset", "profile", "model", "device", "base_url", "api_key_env", "name", "out", "path", "trace_file"):
        return st.text(max_size=10) | st.sampled_from(NASTY[19:])
    return st.integers(-5, 10**8)


def _field(key: str):
    model, field = RunConfig, None
    for part in key.split("."):
        field = model.model_fields[part]
        inner = [a for a in [field.annotation, *typing.get_args(field.annotation)] if isinstance(a, type) and issubclass(a, BaseModel)]
        model = inner[0] if inner else None
    return field


def yaml_text(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("...\n").strip()


set_items = st.one_of(st.tuples(keys, values).map(lambda kv: f"{kv[0]}={yaml_text(kv[1])}"),
                      st.sampled_from(KEYS).flatmap(lambda k: typed(k).map(lambda v: f"{k}={yaml_text(v)}")),
                      st.sampled_from(KEYS).flatmap(lambda k: typed(k).map(lambda v: f"{k}={yaml_text(v)}")),
                      st.tuples(st.sampled_from(KEYS), plausible).map(lambda kv: f"{kv[0]}={yaml_text(kv[1])}"),
                      st.tuples(st.sampled_from(KEYS), st.text(max_size=20)).map(lambda kv: f"{kv[0]}={kv[1]}"),
                      st.text(max_size=30))


def numbers(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from numbers(v, f"{path}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from numbers(v, f"{path}{i}.")
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        yield path.rstrip("."), tree


def assert_sane(cfg: RunConfig) -> None:
    """What an accepted config promises: finite, non-negative, within the stated bounds."""
    for key, v in numbers(cfg.model_dump()):
        assert math.isfinite(v) and v >= 0, (key, v)
    t = cfg.traffic
    assert t.horizon_s <= 2 * MAX_SECONDS
    for d in (t.prompt_len, t.output_len):
        assert all(x is None or 1 <= x <= MAX_LENGTH for x in (d.value, d.low, d.high))
        assert d.median is None or 0 < d.median <= MAX_LENGTH
    if t.arrival != "trace":
        for rate in t.rates:
            n = t.expected_requests(rate)
            assert MIN_RATE <= rate <= MAX_RATE and n <= MAX_REQUESTS_PER_POINT
            assert n * t.mean_tokens() <= MAX_TOKENS_PER_POINT
    assert all("\n" not in w for w in config_warnings(cfg))
    assert_small_trace_is_well_formed(t)


def assert_small_trace_is_well_formed(t: TrafficConfig) -> None:
    """Build the first point's trace when it is small (the caps bound the large ones)."""
    if t.arrival == "trace" or "sharegpt" in (t.prompt_len.dist, t.output_len.dist):
        return
    rate = t.rates[0]
    if t.expected_requests(rate) > 2000:
        return
    trace = build_trace(t, rate)
    arrivals = [i.arrival for i in trace]
    assert arrivals == sorted(arrivals) and all(0 <= a < t.horizon_s for a in arrivals)
    assert all(1 <= i.prompt_len <= MAX_LENGTH and 1 <= i.output_len <= MAX_LENGTH for i in trace)


def load_or_refuse(load) -> RunConfig | None:
    """The property: accepted and sane, or a one-line ConfigError. Anything else fails the test."""
    try:
        cfg = load()
    except ConfigError as e:
        assert str(e) and "\n" not in str(e) and "\r" not in str(e), repr(str(e))
        event("refused")
        return None
    assert_sane(cfg)
    event("accepted")
    return cfg


@settings(FUZZ, max_examples=1000)
@given(st.lists(set_items, min_size=1, max_size=3))
def test_set_overrides_load_sane_or_fail_in_one_line(items):
    load_or_refuse(lambda: load_user_config(None, items))


@settings(FUZZ, max_examples=300)
@given(tree=st.dictionaries(st.one_of(st.sampled_from(["backend", "traffic", "naive", "dynamic", "continuous", "slo",
                                                  "strategies", "name", "out", "report"]), st.text(max_size=6)),
                       st.one_of(values, st.dictionaries(st.sampled_from([k.split(".")[-1] for k in KEYS]) | st.text(max_size=6),
                                                         values, max_size=5)),
                       max_size=5))
def test_random_config_files_load_sane_or_fail_in_one_line(tree, fuzz_dir):
    _write_and_load(tree, fuzz_dir)


SECTIONS = {name: [k.split(".", 1)[1] for k in KEYS if k.startswith(name + ".") and k.count(".") == 1]
            for name in ("backend", "traffic", "naive", "dynamic", "continuous", "slo")}


@settings(FUZZ, max_examples=500)
@given(tree=st.dictionaries(st.sampled_from(sorted(SECTIONS)), st.none(), max_size=6).flatmap(
    lambda sections: st.fixed_dictionaries({s: st.fixed_dictionaries({}, optional={k: typed(f"{s}.{k}") for k in SECTIONS[s]})
                                            for s in sections})))
def test_config_files_of_known_keys_load_sane_or_fail_in_one_line(tree, fuzz_dir):
    _write_and_load(tree, fuzz_dir)


def _write_and_load(tree, fuzz_dir):
    f = fuzz_dir / f"c{next(_names)}.yaml"
    f.write_text(yaml.safe_dump(tree))
    load_or_refuse(lambda: load_config(f))


@settings(FUZZ, max_examples=150)
@given(data=st.binary(max_size=80))
def test_config_files_of_arbitrary_bytes_fail_in_one_line(data, fuzz_dir):
    f = fuzz_dir / f"b{next(_names)}.yaml"
    f.write_bytes(data)
    load_or_refuse(lambda: load_config(f))


cells = st.one_of(st.sampled_from(["0", "0.5", "1", "10", "-1", "nan", "inf", "-inf", "1e9", "1e400", "2.5", "",
                                   " 7 ", "a", "1_000", "0x10", '"3"', "99999999"]),
                  st.integers(-5, 10**7).map(str), st.floats().map(repr), st.text(max_size=4))
rows = st.lists(cells, min_size=0, max_size=5).map(",".join) | st.tuples(
    st.floats(0, 1000).map(repr), st.integers(1, 5000).map(str), st.integers(-1, 5000).map(str)).map(",".join)
headers = st.sampled_from(["arrival_time,prompt_len,output_len", "arrival_time,prompt_len,output_len,prompt",
                           "\ufeffarrival_time,prompt_len,output_len", "arrival_time,prompt_len", "a,b,c", ""])
trace_files = st.one_of(st.tuples(headers, st.lists(rows, max_size=6)).map(lambda hr: "\n".join([hr[0], *hr[1]])),
                        st.text(max_size=60)).map(str.encode) | st.binary(max_size=60)


@settings(FUZZ, max_examples=800)
@given(data=trace_files)
def test_trace_files_load_well_formed_or_fail_in_one_line(data, fuzz_dir):
    f = fuzz_dir / f"t{next(_names)}.csv"
    f.write_bytes(data)
    try:
        items = read_trace_file(str(f))
    except ConfigError as e:
        assert "\n" not in str(e) and str(e).startswith(str(f)), repr(str(e))
        event("refused")
        return
    event("accepted")
    assert 0 < len(items) <= MAX_REQUESTS_PER_POINT
    assert [i.arrival for i in items] == sorted(i.arrival for i in items)
    for i in items:
        assert math.isfinite(i.arrival) and 0 <= i.arrival <= MAX_SECONDS
        assert isinstance(i.prompt_len, int) and 1 <= i.prompt_len <= MAX_LENGTH
        assert isinstance(i.output_len, int) and 1 <= i.output_len <= MAX_LENGTH


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(["conversations", "from", "value", "id"]),
                                                                   inner, max_size=3)),
                           max_leaves=12)
sharegpt_like = st.lists(st.fixed_dictionaries({"conversations": st.lists(st.fixed_dictionaries(
    {"from": st.sampled_from(["human", "gpt", "system"]), "value": st.one_of(st.text(max_size=20), st.integers())}),
    max_size=3)}), max_size=4)


@settings(FUZZ, max_examples=250)
@given(text=st.one_of(json_values, sharegpt_like).map(json.dumps) | st.text(max_size=30))
def test_sharegpt_files_load_or_fail_in_one_line(text, fuzz_dir):
    f = fuzz_dir / f"s{next(_names)}.json"
    f.write_text(text)
    t = TrafficConfig(rates=[2], duration_s=5, warmup_s=0, prompt_len={"dist": "sharegpt", "path": str(f)},
                      output_len={"dist": "sharegpt", "path": str(f), "high": 64})
    try:
        check_inputs(t)
    except ConfigError as e:
        assert "\n" not in str(e), repr(str(e))
        event("refused")
        return
    event("accepted")
    trace = build_trace(t, 2.0)
    assert all(1 <= i.prompt_len <= MAX_LENGTH and 1 <= i.output_len <= 64 and i.prompt for i in trace)


# Values a user is likely to get wrong, on the keys that take numbers: through the real CLI.
NUMERIC_KEYS = [k for k in KEYS if k.split(".")[-1] in {
    "rates", "duration_s", "warmup_s", "seed", "repeats", "burstiness", "batch_size", "max_batch_size",
    "max_wait_ms", "oom_probe_after", "max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "block_size",
    "chunk_size", "ttft_s", "tpot_s", "e2e_s", "replicas", "threads", "memory_budget_bytes", "warmup_batches",
    "timeout_s", "max_connections", "prompt_len", "output_len", "at_s", "to_rate", "until_s"}]
bad_values = st.one_of(st.sampled_from(["inf", ".inf", "-.inf", ".nan", "nan", "1e9", "1e400", "-1", "0", "-0.0",
                                        "[.inf]", "[1e9]", "[-5]", "[]", "many", "{}", "[1, two]", "1e-400",
                                        str(2**64), "true"]),
                       st.floats(allow_nan=True, allow_infinity=True).map(yaml_text),
                       st.integers(-(2**70), -1).map(str), st.integers(10**7, 2**70).map(str))


@settings(FUZZ, max_examples=200)
@given(item=st.one_of(st.tuples(st.sampled_from(NUMERIC_KEYS), bad_values).map(lambda kv: f"{kv[0]}={kv[1]}"),
                 st.tuples(keys, values).map(lambda kv: f"{kv[0]}={yaml_text(kv[1])}"),
                 st.sampled_from(["backend.api_key=sk-123", "nope=1", "traffic..rates=1", "=", "traffic"])))
def test_the_cli_refuses_bad_values_in_one_line_and_writes_nothing(item, fuzz_dir):
    try:
        load_user_config(None, [item])
        event("accepted by the loader: not run (a real sweep would start)")
        return
    except ConfigError:
        event("refused: run through the CLI")
    from batchlab.cli import main
    base = Path(tempfile.mkdtemp(dir=fuzz_dir))
    cwd = os.getcwd()
    os.chdir(base)                           # anything written relative to the working directory lands here too
    try:
        res = CliRunner().invoke(main, ["run", "--quiet", "--set", item, "--out", str(base / "out")])
    finally:
        os.chdir(cwd)
    assert res.exit_code == 2, (item, res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (item, res.stderr)
    assert "sk-123" not in res.stderr
    assert [p for p in base.rglob("*") if p.is_file()] == [], item


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# Production trace formats (core/trace_formats.py): the same property, every format.
prod_headers = st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens", "TIMESTAMP,ContextTokens",
                                "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                                "\ufeffTimestamp,Model,Request tokens,Response tokens,Log Type", "a,b"])
prod_cells = cells | st.sampled_from(["2023-11-16 18:15:46.6805900", "2023-11-16T18:15:46Z", "2023-02-30 00:00:00",
                                      "2023-11-16 18:15:46+25:00", "ChatGPT", "Conversation log", "API log"])
prod_rows = st.lists(prod_cells, min_size=0, max_size=6).map(",".join) | st.tuples(
    st.sampled_from(["2023-11-16 18:15:4", "2023-11-16 18:16:0"]), st.integers(0, 9).map(str),
    st.integers(0, 5000).map(str), st.integers(0, 5000).map(str)).map(lambda c: f"{c[0]}{c[1]},{c[2]},{c[3]}")
prod_csv = st.tuples(prod_headers, st.lists(prod_rows, max_size=6)).map(lambda hr: "\n".join([hr[0], *hr[1]]))
mooncake_obj = st.fixed_dictionaries({"timestamp": st.one_of(st.integers(-5, 10**6), st.floats(), st.text(max_size=3)),
                                      "input_length": st.integers(-1, 3000), "output_length": st.integers(-1, 50)},
                                     optional={"hash_ids": st.one_of(st.lists(st.integers(0, 5), max_size=7),
                                                                     json_values)})
azure_ok = st.tuples(st.integers(0, 59), st.integers(0, 9_999_999), st.integers(0, 3000), st.integers(0, 300)).map(
    lambda c: f"2023-11-16 18:{c[0]:02d}:{c[0]:02d}.{c[1]:07d},{c[2]},{c[3]}")
burst_ok = st.tuples(st.floats(0, 1e5), st.sampled_from(["ChatGPT", "GPT-4"]), st.integers(0, 3000), st.integers(0, 300),
                     st.sampled_from(["Conversation log", "API log"])).map(lambda c: f"{c[0]!r},{c[1]},{c[2]},{c[3]},0,{c[4]}")
mooncake_ok = st.tuples(st.integers(0, 10**6), st.integers(1, 2000), st.integers(0, 50), st.integers(0, 3)).map(
    lambda c: json.dumps({"timestamp": c[0], "input_length": c[1], "output_length": c[2],
                          "hash_ids": [c[3] + k for k in range(-(-c[1] // 512))]}))
coherent = st.one_of(
    st.lists(azure_ok | prod_rows, min_size=1, max_size=6).map(lambda r: "\n".join(["TIMESTAMP,ContextTokens,GeneratedTokens", *r])),
    st.lists(burst_ok | prod_rows, min_size=1, max_size=6).map(
        lambda r: "\n".join(["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", *r])),
    st.lists(mooncake_ok | mooncake_obj.map(json.dumps), min_size=1, max_size=6).map("\n".join))
mooncake_lines = st.lists(st.one_of(mooncake_obj.map(json.dumps), json_values.map(json.dumps), st.text(max_size=10)),
                          max_size=5).map("\n".join)


@settings(FUZZ, max_examples=600)
@given(text=st.one_of(coherent, coherent, prod_csv, mooncake_lines, st.text(max_size=40)),
       fmt=st.sampled_from(["auto", "auto", "azure", "burstgpt", "mooncake"]),
       window=st.fixed_dictionaries({}, optional={"start_s": st.floats(0, 10), "duration_s": st.floats(0.001, 100),
                                                  "time_scale": st.floats(0.01, 100)}))
def test_production_traces_load_well_formed_or_fail_in_one_line(text, fmt, window, fuzz_dir):
    f = fuzz_dir / f"p{next(_names)}.trace"
    f.write_text(text)
    t = TrafficConfig(arrival="trace", trace_file=str(f), replay={"format": fmt, "block_size": 512, **window})
    try:
        warnings = check_inputs(t)
        items = build_trace(t, 1.0)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e).startswith(str(f)), repr(str(e))
        event("refused")
        return
    event("accepted")
    assert all("\n" not in w for w in warnings)
    assert 0 < len(items) <= MAX_REQUESTS_PER_POINT
    assert [i.arrival for i in items] == sorted(i.arrival for i in items)
    for i in items:
        assert math.isfinite(i.arrival) and 0 <= i.arrival <= MAX_SECONDS
        assert 1 <= i.prompt_len <= MAX_LENGTH and 1 <= i.output_len <= MAX_LENGTH
        assert sum(n for _, n in i.content) in (0, i.prompt_len)
