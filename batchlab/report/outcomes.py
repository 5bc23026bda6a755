"""Why a point has no numbers: for every strategy x rate where no request finished after the
warm-up, one line a reader can act on (every request failed, and with what error; none arrived
after the warm-up), shown under the tables and beside the figures that leave the point out.
"""
from __future__ import annotations

import pandas as pd


def point_outcomes(summary: pd.DataFrame, requests: pd.DataFrame | None) -> dict[tuple[str, float], str]:
    """(strategy, rate) -> why nothing was measured there, for every point where no request
    finished after warm-up in any repeat; points with results are absent."""
    out = {}
    for (s, rate), rows in summary.groupby(["strategy", "rate"], sort=False):
        if requests is None:      # summary.csv alone: its counts (NaN where it has none: no claim)
            reqs, n, done = None, _total(rows, "num_requests"), _total(rows, "finished")
        else:
            reqs = requests[(requests["strategy"] == s) & (requests["rate"] == rate) & (requests["warmup"] == 0)]
            n, done = len(reqs), int(finished_rows(reqs).sum())
        if done == 0:
            out[(s, float(rate))] = _why_nothing(n, reqs, rows)
    return out


def _total(rows: pd.DataFrame, column: str) -> float:
    return float(rows[column].sum(min_count=1)) if column in rows else float("nan")


def finished_rows(reqs: pd.DataFrame) -> pd.Series:
    """Finished with a completion time a metric can use (a trace time of inf gives none)."""
    return (reqs["status"] == "finished") & reqs["e2e"].notna()


def _why_nothing(n: float, reqs: pd.DataFrame | None, rows: pd.DataFrame) -> str:
    if n == 0:
        return "no request arrived after the warm-up"
    if reqs is None:
        return f"no requests finished ({_count(_total(rows, 'failed'))} of {_count(n)} failed)"
    failed = reqs[reqs["status"] == "failed"]
    errors = failed["error"].fillna("no reason given").value_counts()
    why = "; ".join(e + (f" ({k}×)" if len(errors) > 1 else "") for e, k in errors.head(3).items())
    if len(failed) == len(reqs):
        return f"no requests finished (all {len(reqs)} failed: {why})"
    rest = f"{len(reqs) - len(failed)} without a finite completion time"
    return f"no requests finished ({len(failed)} of {len(reqs)} failed: {why}; {rest})" if len(failed) else \
        f"no requests finished ({rest})"


def _count(v: float) -> str:
    return "?" if pd.isna(v) else f"{int(v)}"
