"""cost.png: what the traffic costs against the latency it gets, for a backend with a price
(summary.csv's cost columns: a simulator with backend.gpu, or backend.usd_per_gpu_hour).

x: $ per million output tokens at each point (the GPUs' hourly price over the tokens served per
hour: falling with load while the GPUs fill, flat once they are saturated); y: p99 E2E and p99
TTFT. One curve per strategy through the rates; the dash-dot line is the SLO. Down and to the
left is better: the cheapest point under the line is the cheapest way to serve that latency.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from batchlab.report import stats
from batchlab.report.fmt import num
from batchlab.report.plots import STYLE, color, drawable, log_axis, plt, save, slo_line, strategies

PANELS = (("e2e_p99", "p99 E2E (s)", "e2e_s"), ("ttft_p99", "p99 TTFT (s)", "ttft_s"))


def priced(summary: pd.DataFrame) -> bool:
    return "usd_per_m_tokens" in summary and summary["usd_per_m_tokens"].notna().any()


def plot_cost(summary: pd.DataFrame, out: Path, slo: dict) -> Path:
    med = stats.medians(summary)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
        for ax, (metric, label, slo_key) in zip(axes, PANELS):
            for s in strategies(med):
                d = drawable(med[med["strategy"] == s].sort_values("rate"), "usd_per_m_tokens", metric)
                ax.plot(d["usd_per_m_tokens"], d[metric], "o-", color=color(s), lw=2, ms=6, label=s)
                for x, y, r in zip(d["usd_per_m_tokens"], d[metric], d["rate"]):
                    ax.annotate(num(r), (x, y), fontsize=9, textcoords="offset points", xytext=(6, 4), color=color(s))
            slo_line(ax, slo.get(slo_key))
            log_axis(ax, "x")
            log_axis(ax, "y")
            ax.set_xlabel("$ per million output tokens (log)")
            ax.set_ylabel(label)
            ax.set_title(f"{label.split(' (')[0]} against cost per token")
        axes[0].legend(loc="best")
        fig.suptitle("Cost against latency: each point is one arrival rate (labelled); "
                     f"{int(med['gpus'].iloc[0])} GPU(s) at ${med['usd_per_hour'].iloc[0]:,.2f}/h")
        fig.tight_layout()
        return save(fig, out / "cost.png")
