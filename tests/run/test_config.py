"""The run's config model is assembled from the registries: a backend kind or a strategy is one
module plus one registration, and its options become config keys checked like every other."""
import csv
import subprocess
import sys

import pytest

from batchlab import backends, schedulers
from batchlab.errors import ConfigError
from batchlab.run.config import config_warnings, load_config
from batchlab.run.experiment import identity, knobs
from batchlab.run.sweep import run_sweep
from tests.run.plugins import MetronomeOptions, PairsScheduler

SHORT = ["traffic.duration_s=3", "traffic.warmup_s=0", "traffic.rates=[4]", "report=false"]


@pytest.fixture
def plugins():
    backends.register(MetronomeOptions)
    schedulers.register(PairsScheduler)
    yield
    backends.unregister("metronome")
    schedulers.unregister("pairs")


def test_a_backend_and_a_strategy_from_outside_run_a_sweep(plugins, tmp_path):
    cfg = load_config(None, SHORT + ["backend.kind=metronome", "backend.tick_s=0.02", "strategies=[pairs, naive]",
                                     "pairs.wait=false"])
    assert cfg.backend.tick_s == 0.02 and cfg.pairs.wait is False
    out = run_sweep(cfg, tmp_path / "r")
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["strategy"] for r in rows} == {"pairs", "naive"} and all(r["status"] == "finished" for r in rows)
    assert {r["knobs"] for r in rows if r["strategy"] == "pairs"} == {"pairs.wait=False"}
    assert {r["model"] for r in rows} == {"metronome 0.02 s"}
    # its keys are the experiment's like any other; its defaults stay out
    assert identity(cfg)["backend"]["tick_s"] == 0.02 and "pairs" in identity(cfg)
    assert "pairs" not in identity(load_config(None, SHORT + ["backend.kind=metronome", "strategies=[pairs]"]))


def test_a_plugins_keys_are_checked_and_other_kinds_keys_warned(plugins):
    with pytest.raises(ConfigError, match=r"backend.tick_s: Input should be greater than 0"):
        load_config(None, ["backend.kind=metronome", "backend.tick_s=0"])
    with pytest.raises(ConfigError, match=r"pairs.wait: Input should be a valid boolean"):
        load_config(None, ["pairs.wait=maybe"])
    cfg = load_config(None, ["backend.kind=metronome", "backend.preset=toy"])
    assert config_warnings(cfg) == ["backend.preset does not apply to backend.kind 'metronome' (ignored)"]
    assert knobs(load_config(None, ["strategies=[pairs]"]), "pairs") == {"pairs.wait": True}


def test_an_unknown_kind_or_key_is_one_line():
    with pytest.raises(ConfigError, match=r"^backend: Input tag 'tpu' .* does not match any of the expected tags: "
                                          r"'sim', 'hf', 'hf-cb', 'openai'"):
        load_config(None, ["backend.kind=tpu"])
    with pytest.raises(ConfigError, match=r"^backend.presett: unknown key$"):
        load_config(None, ["backend.presett=toy"])
    with pytest.raises(ConfigError, match=r"^backend: Input tag '\[1.0\]' .* does not match any of the expected tags"):
        load_config(None, ["backend.kind=[1.0]"])               # not a string: refused, not a TypeError


def test_a_load_target_takes_only_its_own_strategy_and_no_sessions():
    with pytest.raises(ConfigError, match=r"backend.kind 'openai' takes \[server\]"):
        load_config(None, ["backend.kind=openai"])
    with pytest.raises(ConfigError, match="strategies: backend.kind 'sim' takes"):
        load_config(None, ["strategies=[server]"])
    with pytest.raises(ConfigError, match="traffic.sessions: not supported with backend.kind 'openai'"):
        load_config(None, ["backend.kind=openai", "strategies=[server]", "traffic.sessions={turns: 2}"])


def test_the_simulator_path_never_imports_torch_or_a_web_stack(tmp_path):
    code = f"""
import sys
from batchlab.run.config import load_user_config, config_model
from batchlab.run.sweep import run_sweep
from batchlab.report.report import build_report
config_model()
out = run_sweep(load_user_config(None, {SHORT!r}), {str(tmp_path / 'r')!r})
build_report(out)
heavy = [m for m in ("torch", "transformers", "httpx", "fastapi", "uvicorn", "ray") if m in sys.modules]
assert not heavy, heavy
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
