"""The site's strict build fails on a broken internal link or anchor (make test builds the real
site; this checks that the settings in mkdocs.yml make such a link fail it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.shell import ROOT


def test_a_broken_anchor_fails_the_strict_build(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("*.json"))
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[x](guides/sweeps.md#no-such-section)\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    config |= {"docs_dir": str(docs), "site_dir": str(tmp_path / "site")}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    mkdocs = Path(sys.executable).parent / "mkdocs"
    p = subprocess.run([str(mkdocs), "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")], capture_output=True,
                       text=True, cwd=ROOT, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "does not contain an anchor '#no-such-section'" in p.stderr
