"""The terminal output at 80 columns: every table rendered into an 80-column buffer keeps every
cell whole (no "…") and no line runs past the edge, whatever the numbers' sizes."""
import io

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from batchlab.report import console
from batchlab.report.timeline import BurstResult
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep


def render(*renderables) -> list[str]:
    buf = io.StringIO()
    out = Console(file=buf, width=80, force_terminal=False, color_system=None)
    for r in renderables:
        out.print(r)
    return buf.getvalue().splitlines()


def fits(lines: list[str]) -> None:
    assert lines, "nothing rendered"
    assert not [line for line in lines if "…" in line], "a cell was cut"
    assert max(len(line) for line in lines) <= 80


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("console")
    cfg = load_user_config(None, ["traffic.rates=[5, 50]", "traffic.duration_s=12", "traffic.warmup_s=2", "report=false"])
    run_sweep(cfg, out)
    return pd.read_csv(out / "summary.csv")


def test_the_default_tables_fit_80_columns_with_every_cell_whole(summary):
    lines = render(*console.tables(summary))
    fits(lines)
    text = "\n".join(lines)
    for strategy in ("naive", "dynamic", "continuous"):
        assert sum(line.split()[:1] == [strategy] for line in lines) == 2      # one row per rate
    assert "5 req/s (median of 1 repeat; latencies in s)" in text and "SLO" in text


def test_the_widest_numbers_failures_and_gaps_still_fit(summary):
    wide = summary.copy()
    wide.loc[0, ["throughput_tok_s", "requests_per_s", "failed"]] = [987_654.3, 99_999.9, 1_000_000]
    wide.loc[1, ["ttft_p50", "ttft_p99", "tpot_p50", "e2e_p99"]] = [0.000123456, np.inf, 604_800.0, np.nan]
    wide.loc[2, "slo_attainment"] = 0.08282
    wide["rate"] = wide["rate"].replace({5.0: 0.714286})                      # a replayed trace's mean rate
    lines = render(*console.tables(wide))
    fits(lines)
    text = "\n".join(lines)
    assert "987,654" in text and "failed" in text and "—" in text and "8.3 %" in text and "0.714 req/s" in text


def test_the_burst_table_fits_and_says_what_a_run_never_recovered_from():
    rows = [BurstResult("naive", 5.0, 25.0, 8.09, 31, 218, None, 80.0, 4.0),
            BurstResult("continuous", 5.0, 25.0, 0.0468, 2, 5, 4.0, 0.0, 4.0),
            BurstResult("dynamic", 5.0, 25.0, 4.6, 25, 181, 31.7, None, 4.0)]
    lines = render(console.burst_table(rows))
    fits(lines)
    text = "\n".join(lines)
    assert "31 → 218" in text and "not in run" in text and "4 s" in text and "31.7 s" in text
    assert console.burst_table([]) is None
