"""report.md from a results directory's CSV files alone (never from in-memory state)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from batchlab.bench.verdict import verdict_lines
from batchlab.core.config import ConfigError

COLUMNS = ["strategy", "throughput_tok_s", "requests_per_s", "ttft_p50", "ttft_p99", "tpot_p50",
           "tpot_p99", "e2e_p50", "e2e_p99", "queue_wait_p50", "goodput", "failed"]


def load_results(results_dir: Path) -> tuple[pd.DataFrame, dict, dict]:
    summary_csv = results_dir / "summary.csv"
    if not summary_csv.is_file():
        raise ConfigError(f"{results_dir}: no summary.csv (run `batchlab run --out {results_dir}` first)")
    summary = pd.read_csv(summary_csv)
    setup_path = results_dir / "setup.json"
    setup = json.loads(setup_path.read_text()) if setup_path.is_file() else {}
    cfg_path = results_dir / "config.yaml"
    config = yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else {}
    return summary, setup, config


def build_report(results_dir: Path) -> tuple[Path, list[str]]:
    summary, setup, config = load_results(results_dir)
    lines = verdict_lines(summary, setup)
    md = ["# batchlab report", ""]
    md += [f"**Verdict.** {line}" for line in lines] + [""]
    md += ["## Setup", "", "```yaml", yaml.safe_dump({"setup": setup, "config": config}, sort_keys=False).strip(), "```", ""]
    med = summary.groupby(["rate", "strategy"], sort=False).median(numeric_only=True).reset_index()
    for rate, rows in med.groupby("rate"):
        md += [f"## {rate:g} req/s", "", "Medians over repeats; latencies in seconds, throughput in output tokens/s.", ""]
        cols = [c for c in COLUMNS if c in rows.columns or c == "strategy"]
        md.append("| " + " | ".join(cols) + " |")
        md.append("|" + "---|" * len(cols))
        for _, row in rows.iterrows():
            md.append("| " + " | ".join(_cell(row[c]) for c in cols) + " |")
        md.append("")
    path = results_dir / "report.md"
    path.write_text("\n".join(md))
    return path, lines


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
