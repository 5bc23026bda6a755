"""Validation as a picture: predicted against measured, one panel per metric.

Each point is a held-out cell: x the first real run, y the simulator, the vertical bar its 90 %
interval. On the identity line the simulator is exact; the grey band around it is the machine's
own noise (P90 of |rerun - run| / run over the metric's cells), so a point inside the band is as
close as a second real run would have been. Log axes: cells span light to heavy load.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

TITLES = {"e2e_p50": "p50 E2E (ms)", "ttft_p50": "p50 TTFT (ms)", "tpot_p50": "p50 TPOT (ms)",
          "ttft_p99": "p99 TTFT (ms)", "throughput_tok_s": "saturated throughput (tok/s)"}
MARKERS = "osD^vP*X"


def plot_validation(cells: pd.DataFrame, summary: pd.DataFrame, path: Path) -> Path:
    metrics = list(dict.fromkeys(cells["metric"]))
    cols = min(3, len(metrics))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.2 * rows), squeeze=False)
    strategies = list(dict.fromkeys(cells["strategy"]))
    workloads = list(dict.fromkeys(cells["workload"]))
    colours = dict(zip(strategies, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4))
    for ax, metric in zip(axes.flat, metrics):
        g = cells[cells["metric"] == metric]
        scale = 1.0 if metric.startswith("throughput") else 1e3
        ok = g[np.isfinite(g["real"]) & np.isfinite(g["sim"]) & (g["real"] > 0) & (g["sim"] > 0)]
        if ok.empty:
            ax.set_visible(False)
            continue
        x, y = scale * ok["real"], scale * ok["sim"]
        lo, hi = float(min(x.min(), y.min())) / 1.3, float(max(x.max(), y.max())) * 1.3
        line = np.geomspace(lo, hi, 50)
        s = summary.set_index("metric").loc[metric]
        band = s["noise_p90"] if s["noise_p90"] == s["noise_p90"] else 0.0
        if band > 0:
            ax.fill_between(line, line * (1 - band), line * (1 + band), color="0.88", zorder=0,
                            label="real rerun's spread (P90 of this metric)")
        ax.plot(line, line, color="0.3", lw=1, zorder=1, label="sim = real")
        for (strategy, workload), h in ok.groupby(["strategy", "workload"], sort=False):
            err = np.vstack([scale * (h["sim"] - h["lo"]).clip(lower=0), scale * (h["hi"] - h["sim"]).clip(lower=0)])
            ax.errorbar(scale * h["real"], scale * h["sim"], yerr=err, fmt=MARKERS[workloads.index(workload) % len(MARKERS)],
                        color=colours[strategy], ms=5, elinewidth=0.8, capsize=2, zorder=2,
                        label=f"{strategy}, {workload}")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured (first real run)",
               ylabel="simulated (bar: 90% interval)")
        ax.set_title(f"{TITLES.get(metric, metric)}\nmedian |error| {100 * s['error_median']:.1f}%, "
                     f"in interval {100 * s['coverage']:.0f}%", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        for axis in (ax.xaxis, ax.yaxis):      # plain numbers; minor ticks unlabelled (they collide)
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle("Simulator vs measured on held-out traces", fontsize=12)
    fig.tight_layout(rect=(0, 0.06 + 0.02 * (len(labels) // 4), 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
