"""Price a kept twin's front end again, from arrival costs read inside one run.

`batchlab profile` prices a server's front end from what arrivals cost its running streams
(calibrate/front_end.py). A profile taken before it read them inside one run, among several
stream counts, read them from two runs (the streams alone, then with the arrivals) among 16
streams: on a shared host two runs seconds apart differ in speed by as much as thirty arrivals
add, and two such profiles priced vLLM's front end at 0 and 15 ms a request. `benchmarks/twin.py
--parts rows` reads the probe both ways among 4, 16 and 26 streams; this takes its inside
readings (one arrival at a time, 32- and 384-token prompts), against the kept profile's fitted
steps with no front end, prices the front end from them as the profile does now (per request,
per prompt token and per running row) and writes the profile and twin with it, so a kept
validation can be judged again on it (benchmarks/corrections.py DIR@TWIN). No server is needed.
Usage: python benchmarks/price_front_end.py TWIN_DIR --rows docs/results/twin_vllm_rows.json [--name front-end-within]
  reads TWIN_DIR/profile.json and twin.yaml; writes TWIN_DIR/profile-NAME.json and twin-NAME.yaml
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import yaml

from batchlab.calibrate.front_end import ArrivalProbe, bare, front_end, nested, with_front_end
from batchlab.calibrate.twin_check import LONG_OUTPUT, LONG_PROMPT, Twin
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

FRONT_END = ("frontend_s", "frontend_s_per_token", "admit_s_per_row", "first_token_s", "frontend_on_engine")


def inside_rounds(rows: dict) -> dict[tuple[int, int], list[float]]:
    """(streams, prompt tokens) -> the server's inside readings, one arrival at a time."""
    short, long = rows["short"][0], rows["long"][0]
    return {(n, p): [r[k] for r in rows["rounds_within"]]
            for n in rows["streams"] for p, k in ((short, f"{n}x1"), (long, f"{n}x1x{long}"))}


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a kept twin: holds profile.json and twin.yaml")
    ap.add_argument("--rows", required=True, help="benchmarks/twin.py --parts rows output (JSON)")
    ap.add_argument("--name", default="front-end-within")
    args = ap.parse_args(argv)
    where, rows_path = Path(args.dir), Path(args.rows)
    if not (where / "profile.json").is_file() or not (where / "twin.yaml").is_file():
        raise ConfigError(f"{where}: not a kept twin (no profile.json and twin.yaml)")
    if not rows_path.is_file():
        raise ConfigError(f"--rows {rows_path}: no such file")
    rows = next((c["rows"] for c in json.loads(rows_path.read_text()).get("conditions", {}).values()
                 if "rows" in c and "rounds_within" in c["rows"]), None)
    if rows is None:
        raise ConfigError(f"--rows {rows_path}: no inside readings (written by benchmarks/twin.py --parts rows)")
    server = inside_rounds(rows)
    prof, twin_cfg = json.loads((where / "profile.json").read_text()), load_config(str(where / "twin.yaml"))
    cost = twin_cfg.backend.cost()
    before = max(prof["frontend_idle_s"], prof.get("frontend_beside_s") or 0.0)
    probe = ArrivalProbe(prompts=(rows["short"][0], rows["long"][0]), streams=tuple(rows["streams"]),
                         stream_prompt=LONG_PROMPT, stream_output=LONG_OUTPUT, rounds=len(rows["rounds_within"]))
    fe = front_end(server, Twin(twin_cfg, cost=bare(cost)).replay, before, probe)
    priced = with_front_end(cost, fe)
    new_prof, new_twin = where / f"profile-{args.name}.json", where / f"twin-{args.name}.yaml"
    record = prof | {k: getattr(priced, k) for k in FRONT_END} | {"front_end_priced": fe.record() | {
        "probe": asdict(probe), "rounds_s": nested(server), "read": "inside one run", "from": str(rows_path)}}
    write_atomic(new_prof, json.dumps(record, indent=2) + "\n")
    tree = yaml.safe_load((where / "twin.yaml").read_text())
    tree["backend"]["profile"] = str(new_prof.resolve())
    write_atomic(new_twin, f"# {where / 'twin.yaml'} with its front end priced from arrivals read inside one run "
                 f"({rows_path}).\n" + yaml.safe_dump(tree, sort_keys=False))
    pairs = ", ".join(f"{n} streams, {p} tokens: {1e3 * v:.1f} ms against {1e3 * fe.twin_s[(n, p)]:.1f}"
                      for (n, p), v in fe.server_s.items())
    print(f"arrivals on the server against the steps alone: {pairs}")
    print(f"front end: {1e3 * fe.engine_s:.2f} ms + {1e6 * fe.engine_s_per_token:.1f} us a prompt token + "
          f"{1e6 * fe.engine_s_per_row:.0f} us a running row on the engine, then {1e3 * fe.delay_s:.1f} ms off it; "
          f"wrote {new_prof} and {new_twin}")


if __name__ == "__main__":
    sys.exit(main())
