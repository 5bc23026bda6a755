"""Price a kept twin's front end again, from arrival costs read inside one run.

`batchlab profile` prices a server's front end from what arrivals cost its running streams, read
from two runs (the streams alone, then with the arrivals; calibrate/front_end.py). On a shared
host two runs seconds apart differ in speed by as much as thirty arrivals add, and one profile's
three rounds priced vLLM's front end at 15 ms a request where another's gave 0 ms. The same
probe read inside the run with the arrivals (calibrate/twin_check.py `within`) does not see
that. `benchmarks/twin.py --parts rows` records both readings among several stream counts; this
takes the inside readings among --streams streams, one arrival at a time, for each prompt length
measured (32 and 384 tokens), against the kept profile's fitted steps with no front end, and
writes the profile and twin with the front end priced from them (calibrate/front_end.py
`front_end`, the same line and delay as the profile's own pricing), so a kept validation can be
judged again on it (benchmarks/corrections.py DIR@TWIN). No server is needed.
Usage: python benchmarks/price_front_end.py TWIN_DIR --rows docs/results/twin_vllm_rows.json
       [--streams 16] [--name front-end-within]
  reads TWIN_DIR/profile.json and twin.yaml; writes TWIN_DIR/profile-NAME.json and twin-NAME.yaml
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from batchlab.calibrate.front_end import ArrivalProbe, bare, front_end, with_front_end
from batchlab.calibrate.twin_check import LONG_OUTPUT, LONG_PROMPT, Twin
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

FRONT_END = ("frontend_s", "frontend_s_per_token", "first_token_s", "frontend_on_engine")


def inside_rounds(rows: dict, streams: int) -> dict[int, list[float]]:
    """prompt tokens -> the server's inside readings, one arrival at a time among `streams`."""
    short, long = rows["short"][0], rows["long"][0]
    keys = {short: f"{streams}x1", long: f"{streams}x1x{long}"}
    missing = [k for k in keys.values() if k not in rows["rounds_within"][0]]
    if missing:
        raise ConfigError(f"--streams {streams}: the rows file has no such probe ({', '.join(missing)}); "
                          f"it has {', '.join(map(str, rows['streams']))}")
    return {p: [r[k] for r in rows["rounds_within"]] for p, k in keys.items()}


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a kept twin: holds profile.json and twin.yaml")
    ap.add_argument("--rows", required=True, help="benchmarks/twin.py --parts rows output (JSON)")
    ap.add_argument("--streams", type=int, default=16)
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
    server = inside_rounds(rows, args.streams)
    prof, twin_cfg = json.loads((where / "profile.json").read_text()), load_config(str(where / "twin.yaml"))
    cost = twin_cfg.backend.cost()
    before = max(prof["frontend_idle_s"], prof.get("frontend_beside_s") or 0.0)
    probe = ArrivalProbe(prompts=tuple(server), streams=(args.streams, LONG_PROMPT, LONG_OUTPUT),
                         rounds=len(rows["rounds_within"]))
    fe = front_end(server, Twin(twin_cfg, cost=bare(cost)).replay, before, probe)
    priced = with_front_end(cost, fe)
    new_prof, new_twin = where / f"profile-{args.name}.json", where / f"twin-{args.name}.yaml"
    record = prof | {k: getattr(priced, k) for k in FRONT_END} | {"front_end_priced": fe.record() | {
        "probe": {"prompts": list(probe.prompts), "streams": list(probe.streams), "rounds": probe.rounds},
        "rounds_s": server, "read": "inside one run", "from": str(rows_path)}}
    write_atomic(new_prof, json.dumps(record, indent=2) + "\n")
    tree = yaml.safe_load((where / "twin.yaml").read_text())
    tree["backend"]["profile"] = str(new_prof.resolve())
    write_atomic(new_twin, f"# {where / 'twin.yaml'} with its front end priced from arrivals read inside one run "
                 f"({rows_path}, {args.streams} streams).\n" + yaml.safe_dump(tree, sort_keys=False))
    print(f"front end: {1e3 * fe.engine_s:.2f} ms + {1e6 * fe.engine_s_per_token:.1f} us a prompt token on the engine, "
          f"then {1e3 * fe.delay_s:.1f} ms off it (arrivals: server {', '.join(f'{p}: {1e3 * v:.1f} ms' for p, v in fe.server_s.items())}; "
          f"steps alone {', '.join(f'{p}: {1e3 * v:.1f} ms' for p, v in fe.twin_s.items())}); wrote {new_prof} and {new_twin}")


if __name__ == "__main__":
    sys.exit(main())
