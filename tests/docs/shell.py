"""Running a command as the docs show it: in a scratch directory that has the repository's
configs/ and benchmarks/ beside it, with this environment's `batchlab` and `python` first on PATH."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^[ \t]*```bash[ \t]*\n(.*?)^[ \t]*```", re.S | re.M)
NEEDS = re.compile(r"\bneeds: *([a-z-]+(?: *, *[a-z-]+)*) *$")


@dataclass(frozen=True)
class Command:
    page: str           # path relative to the repository
    line: int           # where the command starts
    text: str           # the command, continuation lines joined, whitespace collapsed, comment removed
    needs: tuple[str, ...]


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment): a `#` starts a comment at the line's start or after whitespace, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
    return line, ""


def commands(page: Path) -> list[Command]:
    """Every command in the page's fenced bash blocks."""
    text = page.read_text()
    out = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).splitlines()
        i = 0
        while i < len(lines):
            start, parts, comments = i, [], []
            while True:
                code, comment = _split_comment(lines[i])
                comments.append(comment)
                stripped = code.rstrip()
                i += 1
                if stripped.endswith("\\") and i < len(lines):
                    parts.append(stripped[:-1])
                    continue
                parts.append(stripped)
                break
            cmd = " ".join(" ".join(parts).split())
            if not cmd:
                continue
            marker = next((m.group(1) for c in reversed(comments) if (m := NEEDS.search(c.strip()))), "")
            where = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
            out.append(Command(where, first + start, cmd,
                               tuple(n.strip() for n in marker.split(",") if n.strip())))
    return out


def all_commands() -> list[Command]:
    return [c for page in PAGES for c in commands(page)]


def scratch(tmp: Path) -> Path:
    """A working directory like a checkout's root for the commands the docs show."""
    for name in ("configs", "benchmarks"):
        (tmp / name).symlink_to(ROOT / name)
    return tmp


def sh(command: str, cwd: Path, extra: list[str] = (), timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `command` (shell syntax, as printed) with `extra` arguments appended."""
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    full = command + "".join(" " + shlex.quote(a) for a in extra)
    return subprocess.run(["bash", "-c", full], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def page_text(rel: str) -> str:
    """A page with whitespace collapsed, so a figure's sentence matches across line breaks."""
    return " ".join((ROOT / rel).read_text().split())
