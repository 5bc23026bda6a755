"""report.html: report.md as one self-contained page, to open or mail as a single file.

The Markdown is rendered by markdown-it-py (CommonMark plus tables; it comes with rich), each
plot is embedded as a base64 data URI, and the style sheet is inline: the page loads nothing
from the network or from beside it. Raw HTML in the Markdown is escaped, not passed through,
so a strategy name or an error message from a CSV cannot inject markup.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

from batchlab.core.files import write_atomic

CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f6f6f6; padding: .8em; overflow-x: auto; font-size: 12px; }
code { background: #f6f6f6; padding: 0 .2em; }
ul li:first-child strong { font-size: 1.1em; }
details.setup { margin-top: 2em; } details.setup > summary { cursor: pointer; font-size: 1.2em; color: #444; }
"""

_IMG = re.compile(r'<img src="([^"/:]+\.png)"')


def render(md_text: str, title: str, images: Path) -> str:
    """The page for `md_text`, with every relative PNG it links (found in `images`) embedded."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(md_text)
    body = _IMG.sub(lambda m: f'<img src="{_data_uri(images / m.group(1))}"', body)
    body = _fold_setup(body)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")


def _fold_setup(body: str) -> str:
    """The setup section, last in the report, folded under a summary line a click opens: the
    machine, versions and every knob are there for whoever checks, not in the way of the answer."""
    head = "<h2>Setup</h2>"
    at = body.find(head)
    if at < 0:
        return body
    return (body[:at] + '<details class="setup"><summary>Setup: the machine, library versions, seed and every knob '
            "of the run (click to open)</summary>\n" + body[at:] + "</details>\n")


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def write_html(report_md: Path) -> Path:
    """report.html beside report.md, from report.md's text and the PNGs beside it."""
    text = report_md.read_text()
    title = text.splitlines()[0].lstrip("# ").strip() if text else "batchlab report"
    out = report_md.with_suffix(".html")
    write_atomic(out, render(text, title, report_md.parent))
    return out
