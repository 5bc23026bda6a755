"""What a person sees in the terminal: a progress bar while the sweep runs, then a table per
rate and the verdict. rich draws both; the numbers come from summary.csv, like every report."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from batchlab.core.config import RunConfig
from batchlab.report.stats import medians
from batchlab.run.results import ResultsDir
from batchlab.run.sweep import pending_points, points, run_sweep

# NOTE: piped output (CI logs, `| tee`) has no terminal width; rich would then squeeze the
# tables to 80 columns and cut every cell. Give it room instead.
console = Console(stderr=False)
if not console.is_terminal:
    console = Console(stderr=False, width=140)

TABLE = [("throughput_tok_s", "tok/s", "{:.0f}"), ("requests_per_s", "req/s", "{:.2f}"),
         ("ttft_p50", "TTFT p50", "{:.3f}"), ("ttft_p99", "TTFT p99", "{:.3f}"),
         ("tpot_p50", "TPOT p50", "{:.4f}"), ("e2e_p50", "E2E p50", "{:.3f}"), ("e2e_p99", "E2E p99", "{:.3f}"),
         ("queue_wait_p50", "queue p50", "{:.3f}"), ("goodput", "goodput/s", "{:.2f}"), ("failed", "failed", "{:.0f}")]


def run_with_progress(cfg: RunConfig, out: Path, quiet: bool = False) -> None:
    total = sum(1 for _ in points(cfg))
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, disable=quiet, transient=False) as bar:
        task = bar.add_task("sweep", total=total)
        done_before = total - len(pending_points(cfg, ResultsDir(out).done_points(), out))
        bar.update(task, completed=done_before)
        run_sweep(cfg, out, on_point=lambda s: bar.advance(task),
                  progress=lambda msg: bar.update(task, description=msg))
        bar.update(task, description="sweep done")
    summary = pd.read_csv(out / "summary.csv")
    print_tables(summary)
    if cfg.report:
        write_report(out)
    console.print(f"results: {out}/requests.csv, {out}/summary.csv" + (f", {out}/report.md" if cfg.report else ""))




def print_tables(summary: pd.DataFrame) -> None:
    med = medians(summary)
    for rate, rows in med.groupby("rate"):
        t = Table(title=f"{rate:g} req/s (medians over repeats; latencies in seconds)")
        t.add_column("strategy")
        for _, label, _ in TABLE:
            t.add_column(label, justify="right")
        for _, row in rows.iterrows():
            t.add_row(row["strategy"], *(fmt.format(row[k]) if k in row and pd.notna(row[k]) else "-"
                                         for k, _, fmt in TABLE))
        console.print(t)


def write_report(results_dir: Path) -> Path:
    from batchlab.report.report import build_report
    path, lines = build_report(results_dir)
    for line in lines:
        console.print(f"[bold green]verdict:[/] {line}")
    plots = sorted(p.name for p in Path(results_dir).glob("*.png"))
    console.print(f"report: {path} with {len(plots)} plots ({', '.join(plots)})")
    return path
