import pytest

from batchlab.core.config import load_config
from batchlab.errors import ConfigError


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
    ("strategies=[naive, turbo]", "strategies.1"),
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
