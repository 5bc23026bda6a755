"""p50 TTFT by turn number of a results directory run with traffic.sessions (report/turns.py),
as a Markdown table per rate: does a later turn, whose prompt resends the conversation so far,
wait longer for its first token, and under which strategy?

Usage: python benchmarks/ttft_by_turn.py RESULTS_DIR [--q 50]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from batchlab.errors import ConfigError, user_errors
from batchlab.report.load import load_requests
from batchlab.report.turns import ttft_by_turn


@user_errors
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--q", type=float, default=50.0, help="percentile (default 50)")
    args = ap.parse_args()
    rows = load_requests(args.results)
    table = ttft_by_turn(rows, args.q) if rows is not None else None
    if table is None or table.empty:
        raise ConfigError(f"{args.results}: no session turns in requests.csv (run with traffic.sessions)")
    name = f"ttft_p{args.q:g}"
    for (rate, repeat), part in table.groupby(["rate", "repeat"]):
        strategies = list(dict.fromkeys(part["strategy"]))
        print(f"\n{rate:g} sessions/s (repeat {int(repeat)}): {name} in ms (turns measured)\n")
        print("| turn | " + " | ".join(strategies) + " |")
        print("|---|" + "---|" * len(strategies))
        for turn, rows_t in part.groupby("turn"):
            cells = []
            for s in strategies:
                r = rows_t[rows_t["strategy"] == s]
                v = r[name].item() if len(r) else math.nan
                cells.append("—" if len(r) == 0 else "failed" if math.isinf(v) else f"{v * 1000:,.0f} ({int(r['requests'].item())})")
            print(f"| {turn} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
