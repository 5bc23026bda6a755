import re

import pytest
from click.testing import CliRunner

from batchlab.cli import main
from batchlab.errors import ConfigError
from batchlab.report.report import build_report
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

TINY = ["traffic.rates=[5, 20]", "traffic.duration_s=15", "traffic.warmup_s=3", "report=false"]
PNG = b"\x89PNG\r\n\x1a\n"


def tiny_sweep(out, extra=()):
    cfg = load_user_config(None, TINY + list(extra))
    return run_sweep(cfg, out)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny sweep and its report, built once for this module."""
    results = tiny_sweep(tmp_path_factory.mktemp("tiny"))
    path, lines = build_report(results)
    return results, path.read_text(), lines


def test_report_has_verdict_setup_tables_comparisons_and_every_plot_it_links(built):
    results, md, lines = built
    assert re.match(r"\w+ sustains .* within TTFT ≤ 1 s and TPOT ≤ 50 ms; ", lines[0])       # the answer first
    assert all(s in lines[0].lower() for s in ("naive", "dynamic", "continuous"))
    pair = next(line for line in lines if line.startswith("Dynamic batching"))
    assert re.search(r"compared to naive batching at (5|20) req/s in simulation \(llama2-7b-a100", pair)
    assert md.startswith("# batchlab report") and lines[0] in md
    for heading in ("## Setup", "## Plots", "### 5 req/s", "### 20 req/s", "## Paired comparisons",
                    "### dynamic vs naive", "## Capacity, knees and crossovers", "## Latency breakdown",
                    "## Useful work in lockstep batches"):
        assert heading in md
    assert "| python |" in md and "| seed | 0" in md and "max_wait_ms: 50" in md
    images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)
    assert {"tradeoff.png", "latency_vs_rate.png", "pareto.png", "cdf.png", "timeline.png", "requests.png",
            "breakdown.png", "useful_work.png"} <= set(images)
    for name in images:
        assert (results / name).read_bytes().startswith(PNG)


def test_a_sweep_where_every_point_has_results_carries_no_outcome_notes(built):
    _, md, lines = built
    for text in ("no requests finished", "no request arrived", "not run at this rate", "Not drawn", "| — |"):
        assert text not in md.split("## Paired comparisons")[0], text
    assert not re.search(r"\b(nan|inf)\b", md, re.I) and not any(re.search(r"\b(nan|inf)\b", x) for x in lines)


def test_report_html_is_one_file_with_every_plot_embedded_and_nothing_fetched(built):
    results, md, lines = built
    page = (results / "report.html").read_text()
    images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert len(sources) == len(images) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r'(src|href)="(?!data:)', page)             # no file, no network
    assert page.count("<table>") == md.count("\n|---") and lines[0] in page.replace("&amp;", "&")


def test_report_regenerates_identically_from_the_csv_files_alone(built):
    results, md, _ = built
    for p in results.glob("*.png"):
        p.unlink()
    (results / "report.md").unlink()
    assert build_report(results)[0].read_text() == md
    assert (results / "tradeoff.png").read_bytes().startswith(PNG)


def test_report_without_request_rows_still_gives_the_sweep_plots(tmp_path, built):
    results = built[0]
    for name in ("summary.csv", "config.yaml", "setup.json"):
        (tmp_path / name).write_bytes((results / name).read_bytes())
    path, lines = build_report(tmp_path)
    assert lines and (tmp_path / "tradeoff.png").is_file() and not (tmp_path / "timeline.png").exists()
    assert "one run per strategy" in path.read_text()


def test_burst_run_reports_peak_queue_recovery_and_slo_seconds(tmp_path):
    out = tiny_sweep(tmp_path / "b", ["traffic.rates=[5]", "traffic.duration_s=40",
                                      "traffic.rate_step={at_s: 10, to_rate: 25, until_s: 15}"])
    path, lines = build_report(out)
    md = path.read_text()
    assert " with a burst to 25 req/s from 10 s to 15 s, within" in lines[0]       # not framed as "5 req/s"
    assert lines[1].startswith("Burst to 25 req/s from 10 s to 15 s: naive peak queue ")
    assert all("with a burst to 25 req/s" in line for line in lines if " batching at " in line)
    section = md.split("## Burst")[1].split("##")[0]
    assert "peak queue during/after" in section and "recovery (s)" in section
    rows = [r for r in section.splitlines() if r.startswith("| naive") or r.startswith("| continuous")]
    assert len(rows) == 2
    assert (out / "burst.png").read_bytes().startswith(PNG)


def test_missing_results_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no summary.csv"):
        build_report(tmp_path)
    res = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "no summary.csv" in res.output


def test_every_plot_has_a_caption_naming_each_trigger_and_phase_it_shows(built):
    import pandas as pd

    from batchlab.report import run_plots
    from batchlab.report.captions import CAPTIONS
    results, md, _ = built
    for name in re.findall(r"!\[([^]]*)\]\(", md):
        assert name in CAPTIONS
    triggers = set(pd.read_csv(results / "requests.csv")["trigger"].dropna()) | {"size", "age", "memory", "drain"}
    for word in [f"*{t}*" for t in triggers] + [f"*{label.split(' (')[0]}*" for _, label, _ in run_plots.PHASES]:
        assert word in CAPTIONS["breakdown"], word


def test_a_priced_backend_gets_cost_columns_and_the_cost_figure_an_unpriced_one_does_not(tmp_path, built):
    results = tiny_sweep(tmp_path / "priced", ["backend.shape=random:llama3-8b", "backend.gpu=L40S",
                                               "backend.usd_per_gpu_hour=1.25", "strategies=[continuous]"])
    path, _ = build_report(results)
    md = path.read_text()
    assert "| tok/s per GPU | $ per M tokens |" in md and "![cost](cost.png)" in md
    assert (results / "cost.png").read_bytes().startswith(PNG)
    assert "$ per million output tokens" in md                     # its caption
    _, unpriced, _ = built
    assert "$ per M tokens" not in unpriced and "cost.png" not in unpriced


def test_the_answer_comes_first_and_the_setup_last_folded_in_html(built):
    results, md, _ = built
    order = [md.index(h) for h in ("## Capacity, knees and crossovers", "## Plots", "## Results per rate", "## Setup")]
    assert order == sorted(order) and md.index("## Setup") > md.index("## How the intervals are made")
    page = (results / "report.html").read_text()
    assert page.count('<details class="setup">') == 1 and page.index("<details") < page.index("<h2>Setup</h2>")
    assert page.index("Every knob of the run") < page.index("</details>") < page.index("</body>")
