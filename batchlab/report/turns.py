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
