"""Shared fixtures.

`ray_local`: a real local Ray with 2 CPUs, started once per session (tests of the Ray executor).
`tiny_model_dir`: a tiny random Llama + tokenizer (batchlab/backends/tiny.py), built once per
machine and cached under the project's data directory ($BATCHLAB_DATA or <repo>/.data), so every
HF test loads a real checkpoint through `from_pretrained` without any download.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SERVER = "server:127.0.0.1:8000"      # the custom resource the test Ray declares for one server


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from batchlab.backends.tiny import ensure_tiny_model
    return ensure_tiny_model()


@pytest.fixture
def unwritable_dir(tmp_path) -> Path:
    """A directory this process cannot write in: chmod for a normal user; root ignores modes,
    so sysfs, where even root cannot create files."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    if Path("/sys/kernel").is_dir():
        return Path("/sys/kernel")
    pytest.skip("running as root without /sys: no unwritable directory to test with")


@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray", reason="the ray extra (pip install 'batchlab[ray]')")
    # NOTE: tests hand Ray workers functions of their own (a worker that dies mid-point); pickled by
    # value, so a worker need not be able to import tests/
    ray.cloudpickle.register_pickle_by_value(sys.modules["tests"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, resources={SERVER: 1}, logging_level="WARNING")
    yield ray
    ray.shutdown()
