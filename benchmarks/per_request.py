"""Which requests does a twin get wrong? A kept validation's real runs, request by request.

A validation judges medians per point; a workload whose median is off could be off in a few
requests (those that arrive in a clump, say) or in all of them alike (the server slower while that
workload ran). This replays every real point of a kept validation (`benchmarks/twin.py` or
`batchlab validate --twin` directory) on the twin without corrections, pairs each finished request
with its replay (the same trace, so the same request ids and arrivals), and reports the median
of twin over server per-request TPOT: over all requests, by the number of requests that arrived
within CLUMP_S of it (itself included), by how many requests were on the server while it decoded
(the load it decoded under), and by the time since the run's start in thirds.
Nothing is sent to a server.
Usage: python benchmarks/per_request.py DIR --twin TWIN [--workloads base,bursty] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.calibrate.twin_check import Twin
from batchlab.core.files import write_atomic
from batchlab.core.metrics import per_request
from batchlab.core.traffic import build_trace
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

CLUMP_S = 0.05                     # arrivals this close to a request's own count as its clump
CLUMPS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 10**9))
IN_FLIGHT = ((0, 4), (4, 8), (8, 16), (16, 24), (24, 10**9))   # (lo, hi]: requests in flight on the server


def replayed(twin: Twin, traffic, rate: float) -> pd.DataFrame:
    """The point's trace on the twin: per finished request its id and TPOT."""
    done = [r for r in twin.replay(build_trace(traffic, rate), traffic, None, rate) if r.output_len > 1]
    return pd.DataFrame({"request_id": [r.request_id for r in done], "twin_tpot": [per_request(r)["tpot"] for r in done]})


def by_request(real: pd.DataFrame, twin: pd.DataFrame) -> pd.DataFrame:
    """The finished, counted requests of one real point beside their replays: ratio twin / server
    TPOT, clump size and when in the run each arrived."""
    point, real = real, real[(real["status"] == "finished") & (real["warmup"] == 0) & (real["output_len"] > 1)]
    real = real.assign(server_tpot=real["tpot"])            # the kept per-request TPOT (core/metrics.py per_request)
    m = real.merge(twin, on="request_id", how="inner")
    a = np.sort(m["arrival_time"].to_numpy())
    m["clump"] = (np.searchsorted(a, m["arrival_time"] + CLUMP_S, side="right")
                  - np.searchsorted(a, m["arrival_time"] - CLUMP_S, side="left"))
    m["ratio"] = m["twin_tpot"] / m["server_tpot"]
    m["in_flight"] = in_flight(point, m)
    return m


def in_flight(point: pd.DataFrame, m: pd.DataFrame) -> np.ndarray:
    """Per request of `m`, how many of the point's requests (itself included) were on the server,
    arrived and not yet answered, on average while it decoded (first token to completion): the
    load it decoded under, whatever the twin predicts for it."""
    a = point["arrival_time"].to_numpy()[None, :]
    c = point["completion_time"].fillna(point["arrival_time"]).to_numpy()[None, :]   # failed: never held
    s, e = m["first_token_time"].to_numpy()[:, None], m["completion_time"].to_numpy()[:, None]
    overlap = np.clip(np.minimum(c, e) - np.maximum(a, s), 0.0, None).sum(axis=1)
    return overlap / np.maximum(e - s, 1e-12)[:, 0]


def figures(m: pd.DataFrame) -> dict:
    """Median ratio over all, per clump size and per third of the run (with counts)."""
    out = {"requests": len(m), "ratio": float(m["ratio"].median()), "clumps": {}, "thirds": []}
    for lo, hi in CLUMPS:
        part = m[(m["clump"] >= lo) & (m["clump"] <= hi)]
        label = str(lo) if lo == hi else (f"{lo}-{hi}" if hi < 10**9 else f"{lo}+")
        out["clumps"][label] = {"requests": len(part), "ratio": float(part["ratio"].median()) if len(part) else None}
    out["in_flight"] = {}
    for lo, hi in IN_FLIGHT:
        part = m[(m["in_flight"] > lo) & (m["in_flight"] <= hi)]
        label = f"{lo}-{hi}" if hi < 10**9 else f"{lo}+"
        out["in_flight"][label] = {"requests": len(part), "ratio": float(part["ratio"].median()) if len(part) else None}
    edges = np.quantile(m["arrival_time"], [0, 1 / 3, 2 / 3, 1])
    for lo, hi in zip(edges[:-1], edges[1:]):
        part = m[(m["arrival_time"] >= lo) & (m["arrival_time"] <= hi)]
        out["thirds"].append(float(part["ratio"].median()))
    return out


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a kept validation (holds validate.yaml and WORKLOAD/real/requests.csv)")
    ap.add_argument("--twin", required=True, help="the server's twin config the validation replayed on")
    ap.add_argument("--workloads", default="base,bursty")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    where = Path(args.dir)
    if not (where / "validate.yaml").is_file():
        raise ConfigError(f"{where}: not a kept validation (no validate.yaml)")
    cfg, twin = load_config(str(where / "validate.yaml")), Twin(load_config(args.twin))
    out = {}
    for w in args.workloads.split(","):
        path = where / w / "real" / "requests.csv"
        if not path.is_file():
            raise ConfigError(f"{where}: no real runs of workload '{w}' ({path} is missing)")
        traffic, real = cfg.workload(w).traffic, pd.read_csv(path)
        out[w] = {f"{rate:g}": figures(by_request(g, replayed(twin, traffic, float(rate)))) for rate, g in real.groupby("rate")}
        for rate, f in out[w].items():
            print(f"{w} at {rate} req/s: twin / server p50 of per-request TPOT {f['ratio']:.3f} over {f['requests']}; "
                  + ", ".join(f"clump {k}: {v['ratio']:.3f} ({v['requests']})" for k, v in f["clumps"].items() if v["requests"])
                  + "; in flight " + ", ".join(f"{k}: {v['ratio']:.3f} ({v['requests']})"
                                               for k, v in f["in_flight"].items() if v["requests"]))
    record = {"command": "python benchmarks/per_request.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "validation": args.dir, "twin": args.twin, "clump_s": CLUMP_S, "workloads": out}
    if args.json:
        write_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
