"""Every strategy x rate point renders, whatever happened there (issue #11): every request failed,
none arrived, all arrived inside the warm-up, exactly one, a replayed trace with odd times, points
missing, NaN or inf cells, every strategy failing everything.

Each case is made by a real simulated sweep wherever the pipeline can make it, and by editing its
CSV files only where it cannot (NaN and inf cells). Each is rendered once by `batchlab report`,
keeping every figure, and checked the same way: exit 0, a report.md without NaN or inf, a row
and, where nothing finished, a reason for every point, every linked PNG written, no axis limit
from NaN, and no warning from numpy, pandas or matplotlib.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from batchlab.cli import main
from batchlab.report import fmt, pareto, plots, run_plots
from batchlab.report.report import build_report
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

SHORT = ["traffic.duration_s=5", "traffic.warmup_s=1", "report=false"]
PNG = b"\x89PNG\r\n\x1a\n"
NOT_A_NUMBER = re.compile(r"\b(nan|inf|infinity)\b", re.IGNORECASE)
ODD_TRACE = "arrival_time,prompt_len,output_len\n0,32,8\n0,32,8\n0,32,8\n2,64,16\n2,64,16\n2,16,4\n9.5,32,8\n"

# Outcomes the simulator produces for real (a fraction of a second each): overrides on top of SHORT.
SWEEPS = {
    # 64 prompts of 1,000 tokens in one naive batch exceed the toy preset's 28,800-token KV budget:
    # naive fails every request at 20 req/s (full batches), not at 5 (smaller drained batches);
    # at 0.001 req/s no arrival falls in the 6 s window at all
    "failures": ["backend.preset=toy", "naive.batch_size=64", "traffic.rates=[0.001, 5, 20]",
                 "traffic.prompt_len={dist: fixed, value: 1000}", "traffic.output_len={dist: fixed, value: 16}"],
    # a prompt larger than the whole KV budget: naive and dynamic run out of memory, continuous
    # rejects every request (as with a tiny continuous.num_kv_blocks)
    "all_fail": ["backend.preset=toy", "traffic.rates=[5]", "traffic.prompt_len={dist: fixed, value: 30000}",
                 "traffic.output_len={dist: fixed, value: 8}"],
    # the same out-of-memory naive batches through a burst (5 -> 40 req/s from 4 to 6 s)
    "burst_failures": ["backend.preset=toy", "naive.batch_size=64", "traffic.rates=[5]", "traffic.duration_s=10",
                       "traffic.prompt_len={dist: fixed, value: 1000}", "traffic.output_len={dist: fixed, value: 16}",
                       "traffic.rate_step={at_s: 4, to_rate: 40, until_s: 6}"],
    # every arrival inside the 3 s warm-up
    "all_in_warmup": ["traffic.rates=[5]", "traffic.warmup_s=3", "traffic.duration_s=0.01"],
    # constant arrivals at 1 req/s over 1.5 s: one request, at t = 1 s
    "one_request": ["traffic.arrival=constant", "traffic.rates=[1]", "traffic.warmup_s=0", "traffic.duration_s=1.5"],
}
CASES = [*SWEEPS, "odd_trace", "edited"]


def sweep(out: Path, overrides: list[str]) -> Path:
    return run_sweep(load_user_config(None, SHORT + overrides), out)


def make_runs(root: Path) -> dict[str, Path]:
    made = {name: sweep(root / name, extra) for name, extra in SWEEPS.items()}
    trace = root / "trace.csv"
    trace.write_text(ODD_TRACE)
    made["odd_trace"] = sweep(root / "odd_trace", ["traffic.arrival=trace", f"traffic.trace_file={trace}"])
    # strategies with points missing (continuous only at 5 req/s), then cells no sweep writes
    sweep(root / "edited", ["strategies=[naive, dynamic]", "traffic.rates=[5, 20]"])
    made["edited"] = edit_cells(sweep(root / "edited", ["strategies=[continuous]", "traffic.rates=[5]"]))
    return made


def edit_cells(out: Path) -> Path:
    """NaN: dynamic's throughput at 20 req/s, naive's p99 TTFT at 5, every seed. inf (what a trace
    time of inf wrote before the driver refused one): continuous's p99 E2E, and every stamp of the
    last request of each run."""
    s = pd.read_csv(out / "summary.csv")
    s.loc[(s["strategy"] == "dynamic") & (s["rate"] == 20), "throughput_tok_s"] = np.nan
    s.loc[(s["strategy"] == "naive") & (s["rate"] == 5), "ttft_p99"] = np.nan
    s.loc[s["strategy"] == "continuous", "e2e_p99"] = np.inf
    s["seed"] = np.nan
    s.to_csv(out / "summary.csv", index=False)
    r = pd.read_csv(out / "requests.csv", dtype=str, keep_default_na=False)
    last = r.groupby(["strategy", "rate"])["request_id"].transform("max") == r["request_id"]
    for col in ("arrival_time", "scheduled_time", "first_token_time", "completion_time", "queue_wait", "ttft", "e2e"):
        r.loc[last, col] = "inf"
    r.to_csv(out / "requests.csv", index=False)
    # Edited by hand, the files no longer match the ledger (row digests) a sweep keeps, and a
    # report of that directory would drop every edited point as torn; without experiment.json the
    # directory is a hand-made one, read as it is.
    (out / "experiment.json").unlink()
    return out


@dataclass
class Rendered:
    out: Path
    exit_code: int
    output: str
    warned: list[str]
    md: str
    figures: dict[str, tuple]      # file name -> (figure, visible axes, figure texts, axis limits)

    def figure(self, name: str) -> tuple:
        return self.figures[name]


def render_cli(out: Path) -> Rendered:
    """`batchlab report DIR`, keeping every figure it draws (still saved) and every warning."""
    figures = {}
    original = plots.save

    def keep(fig, path):
        figures[path.name] = (fig, [ax for ax in fig.axes if ax.get_visible()], [t.get_text() for t in fig.texts],
                              [(ax.get_xlim(), ax.get_ylim()) for ax in fig.axes])
        return original(fig, path)
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mp.setattr(plots, "save", keep)
        mp.setattr(run_plots, "save", keep)
        mp.setattr(pareto, "save", keep)
        res = CliRunner().invoke(main, ["report", str(out)])
    md = (out / "report.md").read_text() if (out / "report.md").is_file() else ""
    warned = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
    return Rendered(out, res.exit_code, res.output + repr(res.exception), warned, md, figures)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Rendered]:
    """Every case swept and rendered once for the module."""
    runs = make_runs(tmp_path_factory.mktemp("outcomes"))
    return {name: render_cli(out) for name, out in runs.items()}


def rate_section(md: str, rate: float) -> str:
    return md.split(f"### {fmt.rate(rate)}\n")[1].split("\n##")[0]


def table_row(md: str, rate: float, strategy: str) -> list[str]:
    row = next(r for r in rate_section(md, rate).splitlines() if r.startswith(f"| {strategy} |"))
    return [c.strip() for c in row.split("|")[1:-1]]


def curve(r: Rendered, name: str, label: str, panel: int = 0):
    lines = [line for line in r.figure(name)[1][panel].get_lines() if line.get_label() == label]
    return lines[0] if lines else None


@pytest.mark.parametrize("case", CASES)
def test_every_outcome_renders_every_point_without_nan_or_warnings(rendered, case):
    r = rendered[case]
    assert r.exit_code == 0, r.output
    assert not r.warned, r.warned
    assert r.md and not NOT_A_NUMBER.search(r.md), NOT_A_NUMBER.search(r.md)
    summary = pd.read_csv(r.out / "summary.csv")
    for (s, rate), _ in summary.groupby(["strategy", "rate"]):
        assert table_row(r.md, rate, s)[0] == s
    images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", r.md)
    assert {"tradeoff.png", "latency_vs_rate.png", "cdf.png", "timeline.png", "requests.png"} <= set(images)
    for name in images:
        assert (r.out / name).read_bytes().startswith(PNG), name
    assert set(r.figures) == set(images)
    for name, (_, _, texts, limits) in r.figures.items():
        assert np.isfinite(limits).all(), name
        assert not any(NOT_A_NUMBER.search(t) for t in texts), (name, texts)


def test_a_strategy_that_failed_every_request_says_why_and_leaves_its_curve(rendered):
    r = rendered["failures"]
    requests = pd.read_csv(r.out / "requests.csv")
    failed = requests[(requests["strategy"] == "naive") & (requests["rate"] == 20) & (requests["warmup"] == 0)]
    assert len(failed) and (failed["status"] == "failed").all()       # the case is what it claims to be
    # each out-of-memory batch says what did not fit, so the reasons differ by batch: the most common is named first
    common = failed["error"].value_counts().index[0]
    assert f"- naive: no requests finished (all {len(failed)} failed: {common}" in rate_section(r.md, 20)
    # every metric cell (SLO met and failed stay): no rate, and every latency percentile reaches a failure
    assert table_row(r.md, 20, "naive")[1:-2] == ["—"] * 2 + ["failed"] * 7 + ["—"]
    assert "no requests finished" not in rate_section(r.md, 5)
    assert "naive at 20 req/s" in r.md.split("## Plots")[1].split("![")[0]
    assert re.search(r"^\| 20 \| naive \| no requests finished \|", r.md, re.M)          # the breakdown
    summary = pd.read_csv(r.out / "summary.csv").set_index(["strategy", "rate"])
    naive = curve(r, "tradeoff.png", "naive")                         # only its 5 req/s point: no broken line
    assert list(naive.get_xdata()) == [pytest.approx(summary.loc[("naive", 5), "throughput_tok_s"])]
    assert any("naive at 0.001, 20 req/s" in t for t in r.figure("tradeoff.png")[2])


def test_a_burst_where_one_strategy_failed_everything_claims_no_recovery_for_it(rendered):
    r = rendered["burst_failures"]
    summary = pd.read_csv(r.out / "summary.csv").set_index("strategy")
    assert summary.loc["naive", "finished"] == 0 and summary.loc["dynamic", "finished"] > 0
    burst = r.md.split("## Burst")[1].split("\n## ")[0]
    naive = next(row for row in burst.splitlines() if row.startswith("| naive |")).split("|")
    assert naive[4].strip() == "—" and naive[7].strip() == "—"       # no pre-burst p99, so no recovery
    dynamic = next(row for row in burst.splitlines() if row.startswith("| dynamic |")).split("|")
    assert dynamic[4].strip() != "—"
    _, axes, texts, _ = r.figure("burst.png")
    assert {str(line.get_label()).split(":")[0] for line in axes[1].get_lines()} == {"dynamic", "continuous"}
    assert any("naive at 5 req/s" in t for t in texts)
    assert any("naive at 5 req/s" in t for t in r.figure("useful_work.png")[2])


def test_a_point_where_no_request_arrived_says_so(rendered):
    r = rendered["failures"]
    for s in ("naive", "dynamic", "continuous"):
        assert f"- {s}: no request arrived after the warm-up" in rate_section(r.md, 0.001)
    # the requests plot moves to the lowest rate that has requests
    assert r.figure("requests.png")[0].get_suptitle().startswith("20 consecutive requests at 5 req/s")


def test_when_everything_fails_every_panel_says_so_and_the_reason_is_in_the_report(rendered):
    r = rendered["all_fail"]
    requests = pd.read_csv(r.out / "requests.csv")
    assert (requests["status"] == "failed").all()
    section = rate_section(r.md, 5)
    for s, rows in requests[requests["warmup"] == 0].groupby("strategy"):
        assert f"- {s}: no requests finished (all {len(rows)} failed: {rows['error'].iloc[0]})" in section
    for name in ("tradeoff.png", "latency_vs_rate.png", "pareto.png", "cdf.png"):
        for ax in r.figure(name)[1]:
            assert not [line for line in ax.get_lines() if not str(line.get_label()).startswith("_")], name
            assert "no requests finished" in [t.get_text() for t in ax.texts], name
    assert "breakdown.png" not in r.md and "Useful work" not in r.md


def test_build_report_on_everything_failed_gives_lines_without_nan(rendered):
    path, lines = build_report(rendered["all_fail"].out)
    assert path.read_text() == rendered["all_fail"].md          # the CLI wrote the same report
    assert lines and not any(NOT_A_NUMBER.search(line) for line in lines)


def test_requests_all_inside_the_warm_up_are_drawn_but_not_measured(rendered):
    r = rendered["all_in_warmup"]
    summary = pd.read_csv(r.out / "summary.csv")
    assert (summary["num_requests"] == 0).all() and len(pd.read_csv(r.out / "requests.csv")) > 0
    for s in summary["strategy"]:
        assert f"- {s}: no request arrived after the warm-up" in rate_section(r.md, 5)
    assert r.figure("requests.png")[0].get_suptitle() == "No request arrived after the warm-up at 5 req/s"
    arrivals = r.figure("timeline.png")[1][0]
    assert sum(p.get_height() for p in arrivals.patches if hasattr(p, "get_height")) > 0


def test_one_request_gets_numbers_not_dashes(rendered):
    r = rendered["one_request"]
    assert (pd.read_csv(r.out / "summary.csv")["finished"] == 1).all()
    assert float(table_row(r.md, 1, "naive")[3]) > 0                          # TTFT p50
    labels = {str(line.get_label()) for line in r.figure("cdf.png")[1][0].get_lines()}
    assert {"naive (n=1)", "dynamic (n=1)", "continuous (n=1)"} <= labels
    assert "no requests finished" not in r.md


def test_a_replayed_trace_with_odd_times_is_one_point_at_its_mean_rate(rendered):
    r = rendered["odd_trace"]
    rate = pd.read_csv(r.out / "summary.csv")["rate"].iloc[0]
    assert rate == pytest.approx(7 / 9.5, rel=1e-5)
    assert f"### {fmt.rate(rate)}" in r.md and "0.737 req/s" in r.md and "no requests finished" not in r.md


def test_missing_points_nan_and_inf_cells_become_dashes_and_gaps_in_the_curves(rendered):
    r = rendered["edited"]
    assert "- continuous: not run at this rate (no row in summary.csv)" in rate_section(r.md, 20)
    assert "not run" not in rate_section(r.md, 5)
    assert table_row(r.md, 20, "dynamic")[1] == "—"                         # tok/s: NaN
    assert table_row(r.md, 5, "naive")[4] == "—"                            # TTFT p99: NaN
    assert table_row(r.md, 5, "continuous")[8] == "failed"                  # E2E p99: inf, a failure reached it
    assert len(curve(r, "tradeoff.png", "continuous").get_xdata()) == 1     # ran at one rate
    assert len(curve(r, "tradeoff.png", "naive").get_xdata()) == 2
    assert len(curve(r, "tradeoff.png", "naive", panel=1).get_xdata()) == 1  # its p99 TTFT at 5 is NaN
    assert len(curve(r, "tradeoff.png", "dynamic").get_xdata()) == 1        # no throughput at 20
    assert any("dynamic at 20 req/s" in t for t in r.figure("tradeoff.png")[2])
