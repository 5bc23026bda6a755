"""Shared fixtures.

`tiny_model_dir`: a tiny random Llama + tokenizer (batchlab/backends/tiny.py), built once per
machine and cached under the project's data directory ($BATCHLAB_DATA or <repo>/.data), so every
HF test loads a real checkpoint through `from_pretrained` without any download.
"""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from batchlab.backends.tiny import ensure_tiny_model
    return ensure_tiny_model()
