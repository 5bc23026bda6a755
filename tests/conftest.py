"""Shared fixtures.

`tiny_model_dir`: a tiny random Llama + tokenizer (batchlab/backends/tiny.py), built once per
machine and cached under the project's data directory ($BATCHLAB_DATA or <repo>/.data), so every
HF test loads a real checkpoint through `from_pretrained` without any download.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest


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
