"""Plots across the sweep, drawn from summary.csv and requests.csv only (PNG, matplotlib Agg).

- tradeoff.png: throughput against p50/p99 TTFT, TPOT and E2E, one curve per strategy through
  the rates. Where a curve turns vertical the strategy has hit its knee: more load, no more
  tokens. A star marks each knee; a cross marks the next rate up, labelled with what it missed.
- latency_vs_rate.png: TTFT / TPOT / E2E p50, p90, p99 against the arrival rate.
- cdf.png: the whole latency distribution of each strategy at one rate.
The plots inside one run (timeline, requests, useful work, breakdown, burst) are in run_plots.py,
the Pareto view in pareto.py.
A point with nothing measured (every request failed, none arrived) has no value to draw: it is
left out of its curve, a note under the figure names it, and a panel with nothing at all says so
instead of setting an axis from NaN.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from batchlab.report import stats  # noqa: E402
from batchlab.report.fmt import RATE_UNIT, load_axis, num
from batchlab.report.fmt import rate as rate_text  # noqa: E402
from batchlab.run.strategies import info  # noqa: E402

# NOTE: Okabe-Ito, a palette whose colours stay apart under every common colour-vision deficiency;
# every plot takes a strategy's colour from here.
OKABE_ITO = {"orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
             "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "grey": "#999999"}
PCT_STYLE = {50: "-", 90: "--", 99: ":"}
STYLE = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10,
         "figure.titlesize": 14, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100}


_ASSIGNED: dict[str, str] = {}       # names given distinct colours for the plots being drawn (distinct_colors)


def color(strategy: str) -> str:
    """The strategy's own colour (each declares one from OKABE_ITO), else one picked from its name."""
    if strategy in _ASSIGNED:
        return _ASSIGNED[strategy]
    extra = [OKABE_ITO[k] for k in ("orange", "sky", "yellow", "grey")]
    return info(strategy).color or extra[sum(map(ord, strategy)) % len(extra)]   # NOTE: hash() varies per process


@contextmanager
def distinct_colors(names: list[str]):
    """While drawing, `names` (e.g. one strategy in two experiments) each get their own colour."""
    palette = list(OKABE_ITO.values())
    _ASSIGNED.update({n: palette[i % len(palette)] for i, n in enumerate(names)})
    try:
        yield
    finally:
        _ASSIGNED.clear()


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def strategies(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["strategy"]))


def log_axis(ax, axis: str = "y") -> None:
    """Log scale with plain numbers (0.02, 5, 300) instead of 2 x 10^-2."""
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    getattr(ax, f"set_{axis}scale")("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(plain)
    target.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if _leading_digit(v) in (2, 5) else ""))


def _leading_digit(v: float) -> int:
    return int(round(v / 10 ** np.floor(np.log10(v)))) if v > 0 else 0


def drawable(d: pd.DataFrame, x: str, y: str, log_y: bool = True) -> pd.DataFrame:
    """The rows of d that can be drawn at (x, y): both finite, y positive on a log axis."""
    if x not in d or y not in d:
        return d.iloc[:0]
    xs, ys = pd.to_numeric(d[x], errors="coerce"), pd.to_numeric(d[y], errors="coerce")
    ok = np.isfinite(xs) & np.isfinite(ys) & ((ys > 0) if log_y else True)
    return d[ok]


def empty_panel(ax, text: str = "no requests finished") -> None:
    """A panel with no data says so, with no tick numbers: its limits are matplotlib's default,
    not data."""
    ax.tick_params(labelbottom=False, labelleft=False, bottom=False, left=False)
    ax.grid(False)
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.3", fontsize=12,
            bbox={"facecolor": "white", "edgecolor": "0.7", "alpha": 0.9})


def missing_note(fig, drawn: dict[str, set], every: dict[str, list]) -> str:
    """Under the figure: the (strategy, rate) points left out of the curves. Returns the text."""
    parts = []
    for s, rates in every.items():
        gone = [r for r in rates if r not in drawn.get(s, set())]
        if gone:
            parts.append(f"{s} at every rate" if len(gone) == len(rates) and len(rates) > 1
                         else f"{s} at {', '.join(num(r) for r in gone)} {RATE_UNIT.get()}")
    text = "Not drawn (nothing measured there: no request finished): " + "; ".join(parts) if parts else ""
    if text:
        fig.text(0.5, 0.0, text, ha="center", va="top", fontsize=10, color="0.3")
    return text


def slo_line(ax, limit: float | None, vertical: bool = False) -> None:
    if limit:
        (ax.axvline if vertical else ax.axhline)(limit, color="0.3", ls="-.", lw=1.2, label=f"SLO ({limit:g} s)")


TRADEOFF_PANELS = [("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E latency")]


def plot_tradeoff(summary: pd.DataFrame, out: Path, slo: dict, knees: dict[str, float | None],
                  broke: dict[str, tuple[float, str]] | None = None) -> Path:
    """Throughput (x) against latency (y, log): rows TTFT, TPOT, E2E; columns p50, p99. Stars
    mark each knee; `broke` maps a strategy to (the next rate up, what it missed), marked ×."""
    med = stats.medians(summary)
    drawn: dict[str, set] = {}
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(3, 2, figsize=(13, 12), sharex=True)
        for ax, (key, name, q) in zip(axes.flat, [(k, n, q) for k, n in TRADEOFF_PANELS for q in (50, 99)]):
            metric = f"{key}_p{q}"
            for s in strategies(med):
                d = drawable(med[med["strategy"] == s].sort_values("rate"), "throughput_tok_s", metric)
                if d.empty:
                    continue
                drawn.setdefault(s, set()).update(d["rate"])
                ax.plot(d["throughput_tok_s"], d[metric], "o-", color=color(s), label=s, lw=2, ms=6)
                for _, row in d.iterrows():
                    ax.annotate(num(row['rate']), (row["throughput_tok_s"], row[metric]), fontsize=9,
                                textcoords="offset points", xytext=(6, -10), color=color(s))
                _mark_knee(ax, d, metric, knees.get(s), color(s))
                _mark_broke(ax, d, metric, (broke or {}).get(s), color(s), name)
            _latency_axis(ax, slo.get(f"{key}_s"))
            ax.set_title(f"p{q} {name}")
            ax.set_ylabel(f"p{q} {name} (s, log scale)")
        for ax in axes[-1]:
            ax.set_xlabel("throughput (output tokens/s)")
        handles, labels = _legend_entries(axes.flat, [s for s in strategies(med) if s in drawn])
        labels = ["SLO threshold" if label.startswith("SLO (") else label for label in labels]   # one per row
        handles.append(Line2D([], [], marker="*", ls="", color="k", ms=14, mfc="none"))
        labels.append("knee: highest load sustained under the SLO")
        if broke:
            handles.append(Line2D([], [], marker="X", ls="", color="k", ms=10, mfc="none"))
            labels.append("next load up: what it missed")
        across = "concurrency levels" if RATE_UNIT.get() == "users" else "arrival rates"
        fig.suptitle(f"Throughput vs latency across {across} (numbers on points: {RATE_UNIT.get()})\n"
                     "a curve that turns vertical has hit its capacity: more load, same tokens/s, longer waits")
        fig.tight_layout(rect=(0, 0, 1, 0.92))
        fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4), bbox_to_anchor=(0.5, 0.94),
                   frameon=False)
        missing_note(fig, drawn, rates_of(med))
        return save(fig, out / "tradeoff.png")


def _mark_broke(ax, d: pd.DataFrame, metric: str, broke: tuple[float, str] | None, c: str, panel: str) -> None:
    """An × at the first rate past the knee; in the panels of the metric that missed there (and
    in the E2E panels when the throughput did), the words 'missed TPOT'."""
    if broke is None:
        return
    row = d[d["rate"] == broke[0]]
    if len(row):
        x, y = float(row["throughput_tok_s"].iloc[0]), float(row[metric].iloc[0])
        ax.plot([x], [y], marker="X", ms=11, mfc="none", mec=c, mew=2, ls="")
        missed = broke[1]
        if panel.split()[0] in missed or (panel.startswith("E2E") and "throughput" in missed):
            ax.annotate(f"missed {missed}", (x, y), fontsize=9, color=c, textcoords="offset points", xytext=(0, 11),
                        ha="center", fontweight="bold")


def _legend_entries(axes, names: list[str]) -> tuple[list, list[str]]:
    """The first panel's legend, plus any strategy drawn only in other panels."""
    axes = list(axes)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label in names and label not in labels:
                handles.append(h)
                labels.append(label)
    return handles, labels


def rates_of(med: pd.DataFrame) -> dict[str, list]:
    return {s: sorted(med.loc[med["strategy"] == s, "rate"]) for s in strategies(med)}


def _latency_axis(ax, limit: float | None, axis: str = "y") -> None:
    """The SLO line and a log scale, or, with no curve at all, a panel that says so."""
    if not ax.get_lines():
        empty_panel(ax)
        if axis == "x":
            ax.set_xlim(0, 1)
        return
    slo_line(ax, limit, vertical=axis == "x")
    log_axis(ax, axis)


def _mark_knee(ax, d: pd.DataFrame, metric: str, knee: float | None, c: str) -> None:
    if knee is None:
        return
    row = d[d["rate"] == knee]
    if len(row):
        ax.plot(row["throughput_tok_s"], row[metric], marker="*", ms=20, mfc="none", mec=c, mew=2, ls="")


def plot_latency_vs_rate(summary: pd.DataFrame, out: Path, slo: dict) -> Path:
    """p50 / p90 / p99 of TTFT, TPOT and E2E against the arrival rate, log latency axis."""
    med = stats.medians(summary)
    drawn: dict[str, set] = {}
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 3, figsize=(16, 5.5))
        for ax, (key, name) in zip(axes, [("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E latency")]):
            for s in strategies(med):
                for q, ls in PCT_STYLE.items():
                    d = drawable(med[med["strategy"] == s].sort_values("rate"), "rate", f"{key}_p{q}")
                    if len(d):
                        drawn.setdefault(s, set()).update(d["rate"])
                        ax.plot(d["rate"], d[f"{key}_p{q}"], ls, marker="o", ms=4, color=color(s), lw=1.8)
            _latency_axis(ax, slo.get(f"{key}_s"))
            ax.set_title(f"{name}: p50 / p90 / p99")
            ax.set_xlabel(load_axis())
            ax.set_ylabel(f"{name} (s, log scale)")
        handles = [Line2D([], [], color=color(s), lw=3, label=s) for s in strategies(med) if s in drawn]
        handles += [Line2D([], [], color="0.2", ls=ls, label=f"p{q}") for q, ls in PCT_STYLE.items()]
        if any(slo.get(k) for k in ("ttft_s", "tpot_s", "e2e_s")):
            handles.append(Line2D([], [], color="0.3", ls="-.", label="SLO"))
        fig.suptitle(f"Latency percentiles vs {load_axis().split(' (')[0]} (medians over repeats)")
        fig.tight_layout(rect=(0, 0, 1, 0.88))
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), bbox_to_anchor=(0.5, 0.92), frameon=False)
        missing_note(fig, drawn, rates_of(med))
        return save(fig, out / "latency_vs_rate.png")


def plot_cdf(requests: pd.DataFrame, out: Path, rate: float, slo: dict) -> Path:
    """Empirical CDFs of TTFT, TPOT and E2E per strategy at one rate (repeat 0, after warm-up)."""
    sel = requests[(requests["rate"] == rate) & (requests["repeat"] == 0) & (requests["warmup"] == 0)
                   & (requests["status"] == "finished")]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
        for ax, (key, name) in zip(axes, [("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E latency")]):
            for s in strategies(sel):
                v = pd.to_numeric(sel.loc[sel["strategy"] == s, key], errors="coerce").to_numpy(float)
                v = np.sort(v[np.isfinite(v) & (v > 0)])     # NOTE: a log axis cannot show 0
                if len(v):
                    ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=color(s), lw=2,
                            label=f"{s} (n={len(v)})")
            _latency_axis(ax, slo.get(f"{key}_s"), "x")
            for q in (0.5, 0.99):
                ax.axhline(q, color="0.6", lw=0.8, ls=":")
            ax.set_ylim(0, 1.02)
            ax.set_title(name)
            ax.set_xlabel(f"{name} (s, log scale)")
            ax.set_ylabel("fraction of requests ≤ x")
        fig.suptitle(f"Latency distributions at {rate_text(rate)} (dotted lines: p50 and p99)")
        fig.tight_layout(rect=(0, 0, 1, 0.88))
        handles = [h for h in axes[0].get_lines() if str(h.get_label()).startswith(tuple(strategies(sel)))]
        if handles and any(slo.get(k) for k in ("ttft_s", "tpot_s", "e2e_s")):
            handles.append(Line2D([], [], color="0.3", ls="-.", lw=1.2, label="SLO threshold"))
        if handles:
            fig.legend(handles=handles, loc="upper center", ncol=len(handles), bbox_to_anchor=(0.5, 0.93), frameon=False)
        every = strategies(requests[requests["rate"] == rate])
        missing_note(fig, {s: {rate} for s in strategies(sel)}, {s: [rate] for s in every})
        return save(fig, out / "cdf.png")
