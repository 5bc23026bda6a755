"""What a person sees in the terminal: a progress bar while the sweep runs (with a running count
of failed requests, and a warning line for each point that had any), then a table per rate and
the verdict. rich draws both; the numbers come from summary.csv, like every report."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from batchlab.core.config import RunConfig
from batchlab.report.stats import medians
from batchlab.run.results import ResultsDir
from batchlab.run.sweep import PointDone, execute, plan_sweep

# NOTE: piped output (CI logs, `| tee`) has no terminal width; rich would then squeeze the
# tables to 80 columns and cut every cell. Give it room instead.
console = Console(stderr=False)
if not console.is_terminal:
    console = Console(stderr=False, width=140)
err_console = Console(stderr=True)

TABLE = [("throughput_tok_s", "tok/s", "{:.0f}"), ("requests_per_s", "req/s", "{:.2f}"),
         ("ttft_p50", "TTFT p50", "{:.3f}"), ("ttft_p99", "TTFT p99", "{:.3f}"),
         ("tpot_p50", "TPOT p50", "{:.4f}"), ("e2e_p50", "E2E p50", "{:.3f}"), ("e2e_p99", "E2E p99", "{:.3f}"),
         ("queue_wait_p50", "queue p50", "{:.3f}"), ("goodput", "goodput/s", "{:.2f}"), ("failed", "failed", "{:.0f}")]


def run_with_progress(cfg: RunConfig, out: Path, quiet: bool = False) -> Path:
    """Plan (every check, nothing written), then run with a progress bar that counts failed
    requests as they happen; then the tables and the report. Returns the results directory."""
    plan = plan_sweep(cfg, out)
    for line in plan.warnings:
        warn(line)
    failed = 0

    def point_done(p: PointDone) -> None:
        nonlocal failed
        failed += p.failed
        bar.update(task, advance=1, failed=f"[red]{failed:,} failed[/]" if failed else "")
        if p.failed:
            s = p.summary
            msg = f"{s['strategy']} @ {s['rate']:g} req/s (repeat {s['repeat']}): {p.failed:,} of {p.requests:,} requests failed"
            bar.update(task, description=msg)
            warn(f"{msg} ({p.error})")

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                  console=console, disable=quiet, transient=False) as bar:
        task = bar.add_task("sweep", total=plan.total, completed=plan.total - len(plan.todo), failed="")
        path = execute(plan, on_point=point_done, progress=lambda msg: bar.update(task, description=msg))
        bar.update(task, description="sweep done")
    if failed:
        warn(f"{failed:,} requests failed in this sweep; requests.csv keeps each one's error")
    print_tables(pd.read_csv(path / "summary.csv"))
    if cfg.report:
        write_report(path)
    where = f"{path}" + (f" ({plan.link} points to it)" if plan.link else "")
    console.print(f"results: {where}: requests.csv, summary.csv" + (", report.md" if cfg.report else ""))
    return path


def warn(line: str) -> None:
    """A warning: one line on stderr, above the progress bar if one is showing."""
    err_console.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)


def _cell(v, fmt: str) -> str:
    """A number, "failed" for a percentile that reaches failed requests (inf), "-" for none."""
    if v is None or pd.isna(v):
        return "-"
    return "failed" if v == float("inf") else fmt.format(v)


def print_tables(summary: pd.DataFrame) -> None:
    med = medians(summary)
    for rate, rows in med.groupby("rate"):
        t = Table(title=f"{rate:g} req/s (medians over repeats; latencies in seconds)")
        t.add_column("strategy")
        for _, label, _ in TABLE:
            t.add_column(label, justify="right")
        for _, row in rows.iterrows():
            t.add_row(row["strategy"], *(_cell(row.get(k), fmt) for k, _, fmt in TABLE))
        console.print(t)


def write_report(results_dir: Path) -> Path:
    from batchlab.report.report import build_report
    path, lines = build_report(results_dir)
    for line in lines:
        console.print(f"[bold green]verdict:[/] {line}")
    plots = sorted(p.name for p in Path(results_dir).glob("*.png"))
    console.print(f"report: {path} with {len(plots)} plots ({', '.join(plots)})")
    return path


def report_dir(results_dir: Path) -> Path:
    """`batchlab report DIR`: drop what a killed run left incomplete (the next run reruns it), then report."""
    for strategy, rate, repeat in ResultsDir(results_dir).tidy():
        warn(f"{strategy} @ {rate:g} req/s (repeat {repeat}) was incomplete (a killed run) and is left out; "
             f"rerun the sweep with --out {results_dir} to complete it")
    return write_report(results_dir)
