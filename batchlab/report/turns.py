"""TTFT by turn number, for multi-turn sessions (traffic.sessions): does a conversation's later
turn, whose prompt resends everything so far, wait longer for its first token?

Reads requests.csv rows (report/load.py) only. A failed turn counts as an infinite TTFT, as in
every percentile batchlab reports (core/metrics.py), so a strategy never looks faster for dropping
its longest prompts; warm-up rows are left out, as everywhere.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from batchlab.core.metrics import percentile
from batchlab.report import fmt


def ttft_by_turn(rows: pd.DataFrame, q: float = 50.0) -> pd.DataFrame:
    """One row per (strategy, rate, repeat, turn): `requests`, `failed` and `ttft_p{q}` (seconds; inf
    where the percentile reaches failed turns). Empty when the rows have no session turns."""
    name = f"ttft_p{q:g}"
    cols = ["strategy", "rate", "repeat", "turn", "requests", "failed", name]
    if "turn" not in rows or rows["turn"].isna().all():
        return pd.DataFrame(columns=cols)
    sel = rows[rows["turn"].notna() & (rows["warmup"] != 1)].copy()
    failed = sel["status"] != "finished"
    sel["ttft_or_inf"] = np.where(failed, np.inf, sel["ttft"])
    sel["failed"] = failed
    sel["turn"] = sel["turn"].astype(int)
    out = (sel.groupby(["strategy", "rate", "repeat", "turn"], sort=True)
           .agg(requests=("turn", "size"), failed=("failed", "sum"),
                **{name: ("ttft_or_inf", lambda v: float(percentile(v.to_numpy(), q)))})
           .reset_index())
    return out[cols]


def turn_lines(rows: pd.DataFrame | None) -> list[str]:
    """report.md's "TTFT by turn" section: per rate, p50 TTFT of each turn number under each
    strategy (median over repeats; in brackets the turns measured, summed over repeats; "failed"
    where the median reaches failed turns). Nothing for runs without sessions."""
    table = ttft_by_turn(rows) if rows is not None else pd.DataFrame()
    if table.empty:
        return []
    md = ["## TTFT by turn", "", "Multi-turn sessions: each later turn resends the conversation so far, so its "
          "prompt grows. p50 TTFT by turn number (median over repeats; turns measured after warm-up in "
          "brackets). A slow strategy's sessions reach fewer turns before the traffic ends: compare turn "
          "by turn.", ""]
    for rate, part in table.groupby("rate", sort=True):
        strategies = list(dict.fromkeys(part["strategy"]))
        md += [f"**{fmt.num(float(rate))} sessions/s**", "", "| turn | " + " | ".join(strategies) + " |",
               "|---" * (len(strategies) + 1) + "|"]
        for turn, at in part.groupby("turn", sort=True):
            cells = []
            for s in strategies:
                mine = at[at["strategy"] == s]
                if mine.empty:
                    cells.append(fmt.DASH)
                    continue
                p50 = float(np.median(mine["ttft_p50"]))
                shown = fmt.seconds(p50) if np.isfinite(p50) else "failed"
                cells.append(f"{shown} ({int(mine['requests'].sum())})")
            md.append(f"| {int(turn)} | " + " | ".join(cells) + " |")
        md.append("")
    return md
