"""tune.png: the batch cap's trade-off, one saturated replica, simulated against the closed form.

Left axis: tokens/s one replica sustains at each cap (simulated dots, closed form b / t(b) dashed).
Right axis: p95 TPOT at each cap (simulated squares, closed form t(b) dashed), with the TPOT-like
SLO lines and the chosen cap. Where the red curve crosses the SLO is the cap; where the blue one
flattens is where a bigger batch stops paying.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from batchlab.tune.target import BATCH_BOUND

if TYPE_CHECKING:
    from batchlab.tune.search import TuneResult


def plot(res: TuneResult, path: Path) -> Path:
    """Throughput and p95 TPOT of one saturated replica against the batch cap, SLO line included."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    ax2 = _draw(res, ax)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    ax.set_title(f"Batch cap vs throughput and p95 TPOT: {res.target.strategy}, one replica at saturation\n"
                 f"{res.cost.description or res.cost.name}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _draw(res: TuneResult, ax):
    """Throughput on `ax`, time per token on a twin axis (returned), simulated and closed form."""
    cf, t = res.closed, res.target
    caps = np.array([p.cap for p in res.sweep])
    ax.plot(caps, [p.served_tok_s for p in res.sweep], "o-", color="tab:blue", label="throughput, simulated")
    ax.plot(caps, caps / (cf.step(caps) / 1e3), "--", color="tab:blue", alpha=0.5, label="throughput, closed form b/t(b)")
    ax.set_xlabel(f"batch cap ({t.knob}, sequences)")
    ax.set_ylabel("throughput per replica (output tokens/s)")
    ax2 = ax.twinx()
    ax2.plot(caps, [1e3 * p.summary["tpot_p95"] for p in res.sweep], "s-", color="tab:red", label="p95 TPOT, simulated")
    ax2.plot(caps, cf.step(caps), "--", color="tab:red", alpha=0.5, label="step time, closed form t(b)")
    for k, v in t.slos.items():
        if k.split("_")[0] in BATCH_BOUND:
            ax2.axhline(v * 1e3, color="black", linestyle=":", label=f"SLO {k} = {v * 1e3:g} ms")
    ax2.axvline(res.cap, color="gray", linestyle="-.", label=f"chosen cap = {res.cap}")
    ax2.set_ylabel("time per output token (ms)")
    return ax2
