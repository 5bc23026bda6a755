"""What a person sees in the terminal: a progress bar while the sweep runs (on stderr, with a
running count of failed requests and a warning line for each point that had any), then the
headline first, a compact table per rate, the burst results of a burst run, and the rest of the
verdict. rich draws both; the numbers come from the results files, like every report.
NOTE: every table fits 80 columns (a test renders them into an 80-column buffer): the console
keeps the columns a reader decides on, and report.md/html keep them all.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from batchlab.core.config import RunConfig
from batchlab.errors import ConfigError
from batchlab.report import fmt
from batchlab.report.stats import medians
from batchlab.run.results import ResultsDir
from batchlab.run.sweep import PointDone, execute, plan_sweep

# NOTE: piped output (CI logs, `| tee`) has no terminal width; verdict lines are soft-wrapped
# (one line each, the terminal wraps them), and the tables fit 80 columns either way.
console = Console(stderr=False)
if not console.is_terminal:
    console = Console(stderr=False, width=140)
err_console = Console(stderr=True)

# (summary column, header, kind): kind "s" seconds, "share" a fraction shown in %, "n" a number
# NOTE: two-line headers keep each column as narrow as its numbers; a number too wide for its
# column folds onto a second line rather than being cut to "…".
TABLE = [("requests_per_s", "req/s\ndone", "n"), ("throughput_tok_s", "tok/s\nout", "n"), ("ttft_p50", "TTFT\np50", "s"),
         ("ttft_p99", "TTFT\np99", "s"), ("tpot_p50", "TPOT\np50", "s"), ("e2e_p99", "E2E\np99", "s"),
         ("slo_attainment", "SLO\nmet", "share"), ("failed", "failed\n", "n")]
COMPACT = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True, "title_justify": "left"}


def run_with_progress(cfg: RunConfig, out: Path, quiet: bool = False) -> Path:
    """Plan (every check, nothing written), then run with a progress bar that counts failed
    requests as they happen; then the headline, tables and report. Returns the results directory."""
    with fmt.rate_unit(cfg.traffic.load_unit):
        return _run_with_progress(cfg, out, quiet)


def _run_with_progress(cfg: RunConfig, out: Path, quiet: bool) -> Path:
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
            msg = (f"{s['strategy']} @ {fmt.rate(s['rate'])} (repeat {s['repeat']}): {p.failed:,} of {p.requests:,} "
                   "requests failed")
            bar.update(task, description=msg)
            warn(f"{msg} ({p.error})")

    # NOTE: on stderr, and gone when done in a terminal, so the headline is the first line of the
    # results; a log keeps its last state (with the failure count).
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                  console=err_console, disable=quiet, transient=err_console.is_terminal) as bar:
        task = bar.add_task("sweep", total=plan.total, completed=plan.total - len(plan.todo), failed="")
        path = execute(plan, on_point=point_done, progress=lambda msg: bar.update(task, description=msg))
        bar.update(task, description="sweep done")
    if failed:
        warn(f"{failed:,} requests failed in this sweep; requests.csv keeps each one's error")
    summary = pd.read_csv(path / "summary.csv")
    if cfg.report:
        write_report(path, summary)
    else:
        print_tables(summary)
    where = f"{path}" + (f" ({plan.link} points to it)" if plan.link else "")
    console.print(f"results: {where}: requests.csv, summary.csv" + (", report.md, report.html" if cfg.report else ""),
                  soft_wrap=True)
    return path


def warn(line: str) -> None:
    """A warning: one line on stderr, above the progress bar if one is showing."""
    err_console.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)


def _cell(v, kind: str) -> str:
    """A number for people, "failed" for a percentile that reaches failed requests (inf), "—" for none."""
    if v is None or pd.isna(v):
        return fmt.DASH
    if v == float("inf"):
        return "failed"
    return fmt.share(v) if kind == "share" else fmt.num(v)


def tables(summary: pd.DataFrame) -> list[Table]:
    """One compact table per rate (medians over repeats)."""
    med = medians(summary)
    reps = fmt.repeats(int(summary["repeat"].nunique())) if "repeat" in summary else "medians"
    out = []
    for rate, rows in med.groupby("rate"):
        t = Table(title=f"{fmt.rate(rate)} ({reps}; latencies in s)", **COMPACT)
        t.add_column("strategy", overflow="fold")
        for _, label, _ in TABLE:
            t.add_column(label, justify="right", overflow="fold")
        for _, row in rows.iterrows():
            t.add_row(str(row["strategy"]), *(_cell(row.get(k), kind) for k, _, kind in TABLE))
        out.append(t)
    return out


def burst_table(rows: list) -> Table | None:
    """Peak queue, recovery and seconds violating the SLO per strategy (report/timeline.py)."""
    if not rows:
        return None
    t = Table(title="Burst (recovery: back to the pre-burst p99 TTFT)", **COMPACT)
    for label in ("strategy", "peak queue", "recovery", "violating SLO"):
        t.add_column(label, justify="left" if label == "strategy" else "right", overflow="fold")
    for b in rows:
        rec = fmt.seconds(b.recovery_s) if b.recovery_s is not None else "not in run"
        t.add_row(b.strategy, f"{b.peak_queue_before} → {b.peak_queue}", rec,
                  fmt.DASH if b.violating_s is None else f"{fmt.num(b.violating_s)} s")
    return t


def print_tables(summary: pd.DataFrame, out: Console | None = None) -> None:
    for t in tables(summary):
        (out or console).print(t)
        (out or console).print()


def write_report(results_dir: Path, summary: pd.DataFrame | None = None) -> Path:
    """Write report.md/html; print the headline, then (with `summary`) the tables and the burst,
    then the rest of the verdict."""
    from batchlab.report.load import load_config_of
    from batchlab.report.report import build_report, burst_results
    with fmt.rate_unit(fmt.unit_of(load_config_of(results_dir).get("traffic"))):
        return _write_report(results_dir, summary, build_report, burst_results)


def _write_report(results_dir: Path, summary: pd.DataFrame | None, build_report, burst_results) -> Path:
    path, lines = build_report(results_dir)
    say = lambda line: console.print(f"[bold green]verdict:[/] {line}", soft_wrap=True, highlight=False)  # noqa: E731
    say(lines[0])
    if summary is not None:
        print_tables(summary)
    burst = burst_table(burst_results(results_dir))
    if burst is not None:
        console.print(burst)
        console.print()
    for line in lines[1:]:
        say(line)
    plots = sorted(p.name for p in Path(results_dir).glob("*.png"))
    console.print(f"report: {path} and report.html with {len(plots)} plots ({', '.join(plots)})", soft_wrap=True)
    return path


def report_dir(results_dir: Path) -> Path:
    """`batchlab report DIR`: leave out the points whose rows are not all there as written, saying
    what was found (the next run reruns them), then report. With no intact point, change nothing."""
    from batchlab.report.load import damaged_points

    found, intact = damaged_points(results_dir)        # read before tidy() rewrites the files without them
    if found and not intact:
        raise ConfigError(f"{results_dir}: no intact point to report ({len(found)} not intact: "
                          f"{_point(*next(iter(found)))} {next(iter(found.values()))}); "
                          f"rerun the sweep with --out {results_dir} to record them again")
    for key in ResultsDir(results_dir).tidy():
        warn(f"{_point(*key)} {found.get(key, 'is not intact')} and is left out; "
             f"rerun the sweep with --out {results_dir} to record it again")
    return write_report(results_dir)


def _point(strategy: str, rate: float, repeat: int) -> str:
    return f"{strategy} @ {fmt.rate(rate)} (repeat {repeat})"
