"""pareto.png: per-user speed against total throughput, as vLLM's `bench sweep` plots it.

Per-user speed is 1 / p50 TPOT, the tokens per second one request sees while it decodes; total
throughput is output tokens/s over the run. One curve per strategy through the rates: up and to
the right is better, and the dashed front joins the points no other point beats on both axes,
the best trade any strategy reached. From summary.csv only (medians over repeats).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.report import stats
from batchlab.report.fmt import RATE_UNIT, num
from batchlab.report.plots import STYLE, color, drawable, empty_panel, missing_note, plt, rates_of, save, strategies


def plot_pareto(summary: pd.DataFrame, out: Path) -> Path:
    """Per-user speed (1 / p50 TPOT) against total output tokens/s, one curve per strategy
    through the rates, and the Pareto front over every point (as vLLM's bench sweep)."""
    med = stats.medians(summary)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(10, 6.5))
        points = []
        for s in strategies(med):
            d = drawable(med[med["strategy"] == s].sort_values("rate"), "throughput_tok_s", "tpot_p50")
            if d.empty:
                continue
            speed = 1 / d["tpot_p50"]
            ax.plot(d["throughput_tok_s"], speed, "o-", color=color(s), lw=2, ms=6, label=s)
            for x, y, r in zip(d["throughput_tok_s"], speed, d["rate"]):
                ax.annotate(num(r), (x, y), fontsize=9, textcoords="offset points", xytext=(6, 4), color=color(s))
            points += list(zip(d["throughput_tok_s"], speed))
        if points:
            front = _pareto_front(points)
            ax.plot(*zip(*front), ls="--", color="0.2", lw=1.2, label="Pareto front (no point beats it on both)")
            ax.legend(loc="best")
            ax.set_ylim(bottom=0)
            ax.set_xlim(left=0)
        else:
            empty_panel(ax)
        ax.set_title(f"Per-user speed against total throughput (numbers on points: {RATE_UNIT.get()})")
        ax.set_xlabel("total throughput (output tokens/s)")
        ax.set_ylabel("per-user speed (tokens/s per request, 1 / p50 TPOT)")
        fig.suptitle("Pareto view: up and to the right is better")
        fig.tight_layout()
        missing_note(fig, {s: set(drawable(med[med["strategy"] == s], "throughput_tok_s", "tpot_p50")["rate"])
                           for s in strategies(med)}, rates_of(med))
        return save(fig, out / "pareto.png")


def _pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes, by throughput."""
    front, best = [], -np.inf
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return sorted(front)
