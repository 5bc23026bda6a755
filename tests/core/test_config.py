import pytest

from batchlab.core.config import LengthDist
from batchlab.core.limits import MAX_REQUESTS_PER_POINT, MAX_TOKENS_PER_POINT
from batchlab.errors import ConfigError
from batchlab.run.config import config_warnings, load_config, load_user_config, validate
from batchlab.run.experiment import config_tree


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(None, ["traffic.rates=[1, 2.5]", "naive.batch_size=8",
                             "traffic.output_len={dist: uniform, low: 5, high: 9}"])
    assert cfg.traffic.rates == [1.0, 2.5] and cfg.naive.batch_size == 8
    assert cfg.traffic.output_len.dist == "uniform" and cfg.traffic.prompt_len.value == 128


@pytest.mark.parametrize("override,message", [
    ("foo.bar=1", "foo: unknown key"),
    ("naive.batchsize=3", "naive.batchsize: unknown key"),
    ("naive.batch_size=0", "naive.batch_size: Input should be greater than 0"),
    ("traffic.rates=[-5]", "traffic.rates.0: Input should be greater than 0 (got -5)"),
    ("traffic.rates=[0]", "traffic.rates.0"),
    ("dynamic.max_wait_ms=soon", "dynamic.max_wait_ms: Input should be a valid number"),
    ("traffic.arrival=trace", "needs traffic.trace_file"),
    ("traffic.output_len={dist: uniform, low: 9, high: 5}", "high (5) must be >= low (9)"),
    ("strategies=[naive, 'turbo mode']", "strategies.1"),   # an unknown name is refused when the sweep is planned
    ("backend.kind=openai", "takes [server]"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("traffic: [1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("traffic:\n  rate: [5]\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: traffic.rate: unknown key"):
        load_config(typo)


# -- bounds: every number finite and sane, and a cap on what one point may generate ---------------

@pytest.mark.parametrize("override,message", [
    ("traffic.rates=[.inf]", "traffic.rates.0: Input should be a finite number (got inf)"),
    ("traffic.rates=[.nan]", "traffic.rates.0: Input should be a finite number"),
    ("traffic.rates=[1e9]", "traffic.rates.0: Input should be less than or equal to 100000"),
    ("traffic.duration_s=1e9", "traffic.duration_s: Input should be less than or equal to 604800"),
    ("traffic.duration_s=inf", "traffic.duration_s: Input should be a finite number"),
    ("traffic.warmup_s=-1", "traffic.warmup_s: Input should be greater than or equal to 0"),
    ("slo.ttft_s=.nan", "slo.ttft_s: Input should be a finite number"),
    ("dynamic.max_wait_ms=.inf", "dynamic.max_wait_ms: Input should be a finite number"),
    ("backend.timeout_s=1e300", "backend.timeout_s: Input should be less than or equal to 86400"),
    ("naive.batch_size=10000000", "naive.batch_size: Input should be less than or equal to 65536"),
    ("continuous.num_kv_blocks=99999999999", "continuous.num_kv_blocks: Input should be less than or equal to"),
    ("traffic.output_len=99999999", "traffic.output_len.value: Input should be less than or equal to 1048576"),
    ("traffic.burstiness=0.0001", "traffic.burstiness: Input should be greater than or equal to 0.01"),
    ("traffic.seed=-1", "traffic.seed: Input should be greater than or equal to 0"),
    ("traffic.rates=[1e-9]", "must be at least 1e-06 req/s"),
    ("traffic.rates=[5, 5]", "rates.1: 5 req/s is listed twice"),
    ("strategies=[naive, naive]", "each strategy may be listed once"),
    ("backend.device=gpu0", "backend.device: expected auto, cpu, cuda, cuda:N or mps"),
    ("backend.dtype=float8", "backend.dtype"),
    ("backend.base_url=localhost:8000", "backend.base_url: expected http://HOST[:PORT]/PATH"),
])
def test_non_finite_and_out_of_bounds_values_are_refused_with_the_bound(override, message):
    kind = {"timeout_s": "openai", "base_url": "openai", "device": "hf", "dtype": "hf"}.get(override.split("=")[0].split(".")[-1])
    with pytest.raises(ConfigError) as e:          # a backend key is checked by the kind that reads it
        load_config(None, [override] + ([f"backend.kind={kind}", "strategies=[server]"] if kind == "openai" else
                                        [f"backend.kind={kind}"] if kind else []))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_point_may_generate_at_most_the_capped_number_of_requests():
    # 20,000 req/s x (5 + 60) s = 1.3 M requests: over the cap, named in the message.
    with pytest.raises(ConfigError) as e:
        load_config(None, ["traffic.rates=[20000]", "traffic.output_len=1", "traffic.prompt_len=1"])
    assert "about 1.3e+06 requests" in str(e.value) and f"{MAX_REQUESTS_PER_POINT:,}" in str(e.value)
    # A rate step's to_rate counts too: 5 req/s, but 90,000 req/s from 1 s to the end.
    with pytest.raises(ConfigError, match="1,000,000 requests per point"):
        load_config(None, ["traffic.rates=[5]", "traffic.rate_step={at_s: 1, to_rate: 90000}"])
    # ... but not once it ends: 10 s of 90,000 req/s is 900 k requests, under the cap.
    cfg = load_config(None, ["traffic.rates=[5]", "traffic.prompt_len=1", "traffic.output_len=1",
                             "traffic.rate_step={at_s: 1, to_rate: 90000, until_s: 11}"])
    assert cfg.traffic.expected_requests(5) == pytest.approx(5 * 55 + 90000 * 10)


def test_a_point_may_generate_at_most_the_capped_number_of_tokens():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["traffic.rates=[50]", "traffic.output_len=1000000"])
    assert f"{MAX_TOKENS_PER_POINT:,} tokens per point" in str(e.value)


def test_clipped_lognormal_mean_matches_sampling():
    import numpy as np
    d = LengthDist(dist="lognormal", median=100, sigma=1.0, low=20, high=300)
    x = np.clip(np.rint(100 * np.exp(np.random.default_rng(0).standard_normal(400_000))), 20, 300)
    assert d.mean() == pytest.approx(x.mean(), rel=0.01)


# -- secrets never in a config ---------------------------------------------------------------------

def test_an_api_key_in_a_config_is_refused_without_echoing_it(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["backend.api_key=sk-secret-123"])
    assert "OPENAI_API_KEY" in str(e.value) and "backend.api_key_env" in str(e.value)
    assert "sk-secret-123" not in str(e.value)
    f = tmp_path / "c.yaml"
    f.write_text("backend:\n  kind: openai\n  api_key: sk-secret-123\nstrategies: [server]\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert "api_key is never read" in str(e.value) and "sk-secret-123" not in str(e.value)


@pytest.mark.parametrize("override", ["backend.api_key_env=sk-secret-123",
                                      "backend.base_url=http://user:sk-secret-123@host:8000/v1"])
def test_a_key_put_in_the_wrong_place_is_refused_without_echoing_it(override):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["backend.kind=openai", "strategies=[server]", override])
    assert "sk-secret-123" not in str(e.value)
    # on a kind that never reads it, the key is dropped: named in a warning, its value nowhere
    cfg = load_config(None, [override])
    assert "sk-secret-123" not in str(config_warnings(cfg)) + config_tree(cfg).__repr__()


def test_api_key_env_names_a_variable_and_is_written_as_a_name():
    cfg = load_config(None, ["backend.kind=openai", "strategies=[server]", "backend.api_key_env=MY_KEY"])
    assert cfg.backend.api_key_env == "MY_KEY" and "api_key" not in cfg.backend.model_dump()


# -- warnings for keys the chosen backend ignores ----------------------------------------------------

@pytest.mark.parametrize("overrides,expected", [
    (["backend.model=llama", "backend.device=cpu"],
     ["backend.device does not apply to backend.kind 'sim'", "backend.model does not apply to backend.kind 'sim'"]),
    (["backend.kind=hf", "backend.preset=toy"], ["backend.preset does not apply to backend.kind 'hf'"]),
    (["backend.kind=openai", "strategies=[server]", "continuous.max_num_seqs=8", "dynamic.max_wait_ms=3"],
     ["continuous.max_num_seqs does not apply to backend.kind 'openai'", "dynamic.max_wait_ms does not apply"]),
    (["backend.kind=hf-cb", "strategies=[server]", "continuous.max_num_seqs=8", "continuous.chunk_size=4"],
     ["continuous.chunk_size does not apply to backend.kind 'hf-cb'"]),
    (["traffic.arrival=trace", "traffic.trace_file=t.csv", "traffic.rates=[3]"],
     ["traffic.rates does not apply to arrival 'trace'"]),
    (["traffic.burstiness=0.5"], ["traffic.burstiness does not apply to arrival 'poisson'"]),
    (["traffic.replay.format=azure", "traffic.replay.time_scale=2"], ["traffic.replay does not apply to arrival 'poisson'"]),
])
def test_keys_the_backend_ignores_get_a_warning_line(overrides, expected):
    warnings = config_warnings(load_user_config(None, overrides))
    assert len(warnings) == len(expected), warnings
    assert all(w.startswith(e) and w.endswith("(ignored)") and "\n" not in w for w, e in zip(warnings, expected))


def test_keys_that_apply_or_come_from_the_packaged_defaults_give_no_warning(tmp_path):
    assert config_warnings(load_user_config(None, [])) == []
    assert config_warnings(load_user_config(None, ["backend.kind=hf", "backend.model=tiny", "backend.device=cpu"])) == []
    assert config_warnings(load_user_config(None, ["backend.kind=openai", "strategies=[server]",
                                                   "backend.model=m", "backend.base_url=http://h/v1"])) == []
    f = tmp_path / "c.yaml"
    f.write_text("backend: {kind: sim, model: x}\n")
    assert config_warnings(load_config(f)) == ["backend.model does not apply to backend.kind 'sim' (ignored)"]
    # Built directly (no load_config): the fields that were set count.
    assert config_warnings(validate({"traffic": {"burstiness": 0.5}})) == [
        "traffic.burstiness does not apply to arrival 'poisson' (only gamma has a shape) (ignored)"]


# -- one line, whatever the input -------------------------------------------------------------------

def test_yaml_and_encoding_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("traffic:\n  rates: [1, 2\nname: x\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "not valid YAML" in str(e.value) and "line" in str(e.value) and "\n" not in str(e.value)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["traffic.rates=[1, {"])
    assert "cannot parse" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="empty key name"):
        load_config(None, ["traffic..rates=[1]"])
    with pytest.raises(ConfigError, match="unknown key") as e:
        load_config(None, ["we\nird=1"])
    assert "\n" not in str(e.value)


def test_the_first_token_correction_is_a_delay_unless_told_and_old_booleans_keep_their_meaning():
    assert load_config(None, []).validation.first_token == "delay"
    assert load_config(None, ["validation.first_token=true"]).validation.first_token == "factor"   # what true meant
    assert load_config(None, ["validation.first_token=false"]).validation.first_token == "off"
    with pytest.raises(ConfigError, match="first_token"):
        load_config(None, ["validation.first_token=sometimes"])


def test_the_corrections_standard_errors_count_workloads_unless_told_cells():
    assert load_config(None, []).validation.se_units == "workloads"
    assert load_config(None, ["validation.se_units=cells"]).validation.se_units == "cells"
    with pytest.raises(ConfigError, match="se_units"):
        load_config(None, ["validation.se_units=runs"])


def test_the_interval_rule_is_one_of_two_and_says_so_when_not():
    assert load_config(None, []).validation.interval == "held-out"
    assert load_config(None, ["validation.interval=step-cost"]).validation.interval == "step-cost"
    with pytest.raises(ConfigError, match="interval") as e:
        load_config(None, ["validation.interval=wide"])
    assert "\n" not in str(e.value)
