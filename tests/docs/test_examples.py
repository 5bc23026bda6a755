"""An example a test runs (`<!-- example:NAME -->` before a code block) may appear on several
pages; every copy must be the one the test runs."""
from __future__ import annotations

import re

from tests.docs.shell import PAGES, ROOT

EXAMPLE = re.compile(r"<!-- example:([\w-]+) -->\n```\w*\n(.*?)```", re.S)


def test_every_copy_of_an_example_is_identical():
    copies: dict[str, dict[str, str]] = {}
    for page in PAGES:
        for m in EXAMPLE.finditer(page.read_text()):
            copies.setdefault(m.group(1), {})[str(page.relative_to(ROOT))] = m.group(2)
    assert "policy" in copies and "README.md" in copies["policy"], "the README's example policy block is gone"
    for name, where in copies.items():
        assert len(set(where.values())) == 1, f"example:{name} differs between {', '.join(where)}"
