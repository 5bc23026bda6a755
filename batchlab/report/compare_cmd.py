"""`batchlab compare DIR DIR ...`: see report/compare.py."""
from __future__ import annotations

from pathlib import Path

import click

from batchlab.errors import user_errors


@click.command("compare")
@click.argument("dirs", nargs=-1, type=click.Path(file_okay=False))
@click.option("--out", default="results/compare", show_default=True, help="Directory for compare.md, compare.html and the plots.")
@user_errors
def compare_cmd(dirs, out) -> None:
    """Two or more results directories side by side at their common rates (e.g. before and after a
    knob change): each strategy against itself in the first, request by request."""
    from batchlab.report.compare import build_compare
    path, lines = build_compare([Path(d) for d in dirs], Path(out))
    for line in lines:
        click.echo(line)
    click.echo(f"wrote {path} and {path.with_suffix('.html').name}")
