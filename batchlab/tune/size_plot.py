"""size.png: cost against latency for every setting `batchlab size` simulated.

x: what the setting costs per hour; y: its worst SLO percentile over that SLO's limit (below the
dotted line at 1 every SLO holds). Filled markers hold the traffic by the sustain rule, hollow ones
do not (an SLO, or a queue that grows); colour is the GPU, the star the pick. Reading left to
right, the first filled marker is the cheapest setting that holds.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchlab.tune.size import SizeResult


def worst_ratio(figures: dict[str, float], slos: dict[str, float]) -> float:
    ratios = [figures.get(k, math.nan) / v for k, v in slos.items()]
    return max((r for r in ratios if r == r), default=math.nan)


def plot(res: SizeResult, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 5))
    shown = [s for s in res.settings if s.simulated]
    names = sorted({s.device.gpu or "as configured" for s in shown})
    colours = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    for s in shown:
        c = colours[s.device.gpu or "as configured"]
        ax.scatter(s.usd_per_hour, worst_ratio(s.figures, res.slos), s=36, edgecolors=[c],
                   facecolors=[c] if s.holds else "none", linewidths=1.2)
    for n in names:
        ax.scatter([], [], color=colours[n], label=n)
    pick = res.pick
    if pick is not None:
        ax.scatter(pick.usd_per_hour, worst_ratio(pick.figures, res.slos), marker="*", s=260, color="black",
                   zorder=5, label=f"pick: {pick.replicas} x {pick.device.label}, cap {pick.cap}")
    ax.axhline(1.0, color="black", linestyle=":", label="SLO limit")
    ax.set_yscale("log")
    ax.set_xlabel("$ per hour" if res.priced else "GPUs (no price set)")
    ax.set_ylabel("worst SLO percentile / its limit")
    ax.set_title(f"Cost vs latency: {res.strategy} at {res.traffic.qps:.3g} req/s "
                 f"(filled: holds the traffic, hollow: does not)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
