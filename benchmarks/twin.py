"""Check a server's twin: profile the server from the client, then hold the twin to what the server does.

    python benchmarks/twin.py configs/twin-vllm.yaml [--condition quiet|busy] [--parts profile,knee,validate,whatif,contention,requests,rows,sizes]

The server (vLLM by default; --server transformers or batchlab: `transformers serve` or
`batchlab serve` continuous on --serve-config's model) starts with the config's `continuous`
limits, pinned to core 1 while this client has core 0, and is restarted for every condition and
every what-if cap.
1. profile: `batchlab profile` on the server (black box) writes OUT/profile.json and OUT/twin.yaml,
   once: later conditions reuse it, because the question is what a profile taken on a quiet
   machine predicts. Its front end is priced from what arrivals cost the server's streams
   (calibrate/front_end.py); OUT/twin-front-end-idle.yaml is the same profile with the idle
   front-end reading on the engine instead, for judging a validation on both.
2. knee: the rate the server sustains under the config's SLO, searched --sustain-repeats times as
   benchmarks/serving.py searches it, and the rate the twin predicts by the same search and verdict
   on the same seeded traces (calibrate/twin_check.py). With --speed-probe, a saturated burst on
   the server just before each search, and the twin's knee again with its steps scaled until its
   burst matches theirs: the machine's speed at the time of the question, read off the server.
3. validate: `batchlab validate --twin` on the base traffic and the config's held-out workloads, each
   at three rates below capacity (--fractions of the rate the server completes saturated on that
   workload's requests): every point on the server twice (the noise floor), on the twin, and on the
   twin with its step costs moved by the fit's error (the interval); a saturated burst each.
4. whatif: the server at other sequence caps (--caps), saturated bursts at each, against the
   twin's prediction from the one profile. By default (--whatif-pairs 6) each cap's server is
   started beside a second server at the profile's cap (both pinned to the same core; one works
   while the other waits) and the pairs of bursts alternate between them, in ABBA order: a
   machine whose speed moves over minutes moves both of a pair alike, so the change is read pair
   by pair. With --whatif-pairs 0, --whatif-runs bursts on the first server (the control) and
   then on each cap's, one server after another.
5. contention: where a busy machine's slowdown comes from. --contention-rounds rounds of three
   saturated bursts in rotating order: quiet, the background load on the server's core only, and
   on every core (the client's too); beside each the share of the server's core others took
   (baselines/contention.py). A server that loses only that core time runs 1 / (1 - share) as long.
0. alternate: the base traffic and a held-out workload (--alternate-with) alternately on the
   server from its start, --alternate-pairs pairs at the validation's middle rates, each trace
   also on the twin; per point the medians, the time the streams stood still with work in hand,
   the server's kernel time and page faults, the time the hypervisor stole, and the host's speed
   just before (a fixed piece of work timed on the client's core). A workload's own error keeps
   its size in every pair; a server that changes while a validation runs its workloads one after
   another does not. Runs before every other part, right after the warm-up.
Every server gets --warm-bursts saturated bursts, unrecorded, as soon as it answers (with 0, the
parts see it fresh: on vLLM its first half-minute of traffic ran about 1.3x slow).
6. requests: what one request costs the others, --request-rounds rounds on the server and once on
   the twin: 16 streams decoding alone and with 30 short requests arriving among them (the time
   one arrival adds), the same 30 in five clumps of six (what arriving together adds), and in
   clumps of six that decode 48 tokens beside the streams (what clumps that stay add), the 30
   one by one with 384-token prompts (what a long prompt adds), and 16
   streams one of which finishes every other step (what a finish adds
   to the next step); calibrate/twin_check.py.
7. rows: the arrival probe among 4, 16 and 26 streams, the arrivals one at a time, in clumps
   of six, and one at a time with 384-token prompts, --request-rounds rounds on the server (each in another order) and once on the twin:
   whether one arrival costs a server more, beyond the twin's steps, the more rows it lands among.
8. sizes: bursts of each of --sizes requests at once (the what-if burst's prompt and output
   lengths, --whatif-runs each) on the server as started, and the same bursts on the twin, each
   judged over its whole span (tok/s from the first arrival to the last token, the median gap
   between two tokens): how the step follows the number of rows past the batch sizes the profile
   timed (a server with no sequence cap, such as transformers serve, runs a whole burst at once).
--condition busy runs 2 and 3 with a background load on both cores (baselines/background.py).
--predict-only recomputes the twin's side of 2 and 4 (after a new profile) beside the server's
figures already measured, and starts no server.
Each part's figures go to --json (docs/results/twin_vllm.json) as soon as they exist; parts not run
keep what an earlier run measured, with its command and load. A validation's cells are copied
beside it (cells/STEM-CONDITION.csv), so benchmarks/intervals.py can judge them again from a clone.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import yaml

from batchlab.backends import process
from batchlab.backends.openai_client import OpenAIBackend
from batchlab.backends.server_limits import from_section
from batchlab.baselines import compare, vllm
from batchlab.baselines.background import background_load
from batchlab.baselines.contention import contention, host_speed, stolen_s, usage
from batchlab.baselines.loadtest import open_loop
from batchlab.calibrate.accuracy import sides
from batchlab.calibrate.blackbox import ProbeGrid
from batchlab.calibrate.fit import opt_in_terms
from batchlab.calibrate.front_end import bare
from batchlab.calibrate.handover import HandOverProbe
from batchlab.calibrate.server import profile_server
from batchlab.calibrate.twin import idle_reading
from batchlab.calibrate.twin_check import (
    CLUMP,
    LONG_ARRIVAL,
    LONG_OUTPUT,
    LONG_PROMPT,
    SHORT,
    STAY,
    Twin,
    alternation,
    arrival_cost,
    arrival_seconds,
    finish_cost,
    point_figures,
    predicted_burst,
    predicted_knee,
    predicted_whole_burst,
    scaled_to_burst,
    whole_burst,
)
from batchlab.calibrate.validate import report_lines, validate
from batchlab.core.files import write_atomic
from batchlab.core.search import significant
from batchlab.core.sustain import saturated_rate
from batchlab.core.traffic import build_trace, burst_trace, fixed_burst
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config
from batchlab.schedulers import ContinuousConfig

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("alternate", "profile", "knee", "validate", "whatif", "contention", "requests", "rows", "sizes")
TWIN_PARTS = ("alternate", "knee", "validate", "whatif", "requests", "rows", "sizes")   # the parts that predict on the twin
ROWS = (4, 16, 26)                 # rows: streams the arrivals land among (26 and a clump of 6 fill a cap of 32)
GRID = ProbeGrid(batch_sizes=(1, 2, 4, 8, 16, 32), contexts=(16, 64, 128, 256), prompts=(16, 64, 256, 512),
                 new_tokens=24, repeats=3, warmup=1)
BURST = (384, 64, 32)              # the what-if burst: requests, prompt and output tokens
SATURATION = 256                   # requests at once that measure a workload's saturated rate
BATCHLAB_PORT = 8010               # --server batchlab: where batchlab serve listens


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default=str(ROOT / "configs" / "twin-vllm.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    ap.add_argument("--server", choices=["vllm", "transformers", "batchlab"], default="vllm")
    ap.add_argument("--serve-config", default=str(ROOT / "configs" / "vs-vllm.yaml"), help="--server batchlab: the config it serves")
    ap.add_argument("--condition", choices=["quiet", "busy"], default="quiet")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)} (comma-separated)")
    ap.add_argument("--busy-duty", type=float, default=0.4, help="busy: share of each core the background load burns")
    ap.add_argument("--bracket", default="12,36", metavar="LO,HI", help="req/s the knee searches start from")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--max-points", type=int, default=8)
    ap.add_argument("--sustain-repeats", type=int, default=2)
    ap.add_argument("--fractions", default="0.25,0.45,0.65",
                    help="validate: rates as fractions of each workload's saturated rate on the server")
    ap.add_argument("--caps", default="8,128", help="whatif: sequence caps the server is restarted with")
    ap.add_argument("--whatif-burst", default=",".join(map(str, BURST)), metavar="N,PROMPT,OUTPUT",
                    help="whatif: the burst measured at each cap (requests, prompt and output tokens; an output of 2 "
                         "times the prompt passes almost alone)")
    ap.add_argument("--sizes", default="16,32,64,128,192", help="sizes: requests sent at once in each burst")
    ap.add_argument("--whatif-runs", type=int, default=2, help="whatif, --whatif-pairs 0: bursts at each cap (median judged)")
    ap.add_argument("--whatif-pairs", type=int, default=6,
                    help="whatif: each other cap's server runs beside one at the profile's cap and N pairs of bursts "
                         "alternate between them, so the machine's speed moves both alike; 0: --whatif-runs bursts "
                         "on servers started one after another (two such measurements thirteen minutes apart read vLLM's "
                         "cap-128 change as +27.8 and +3.5 %%, two paired ones +21.3 and +19.1 %%)")
    ap.add_argument("--batch-sizes", default=",".join(map(str, GRID.batch_sizes)),
                    help="profile: the decode bursts' sizes (up to the server's cap: a profile of a server started "
                         "at a larger cap can measure the steps a what-if at that cap runs)")
    ap.add_argument("--hand-over-fit", action="store_true", help="profile: as batchlab profile --hand-over-fit")
    ap.add_argument("--with", dest="with_terms", default="", metavar="TERMS", help="profile: as batchlab profile --with")
    ap.add_argument("--crowds", default="", help="profile: as batchlab profile --crowds (e.g. 4,8,16; none by default)")
    ap.add_argument("--speed-probe", action="store_true",
                    help="knee: a saturated burst before each search, and the twin scaled to match it")
    ap.add_argument("--contention-rounds", type=int, default=3, help="contention: rounds of quiet / server core / every core")
    ap.add_argument("--request-rounds", type=int, default=5, help="requests: rounds of the arrival and finish probes")
    ap.add_argument("--warm-bursts", type=int, default=2,
                    help="saturated bursts sent to every server after it starts, before any part measures "
                         "(a fresh server's first traffic runs slow while it first touches its memory)")
    ap.add_argument("--alternate-with", default="bursty", help="alternate: the held-out workload run between base points")
    ap.add_argument("--alternate-pairs", type=int, default=4, help="alternate: pairs of points (base, then the other)")
    ap.add_argument("--predict-only", action="store_true",
                    help="knee, whatif: recompute the twin's predictions (a new profile) beside the measured figures kept")
    ap.add_argument("--front-end-on-engine", action="store_true",
                    help="use the profile with its front end charged to the engine (batchlab profile does this for a "
                         "server that says it computes on the CPU; a profile taken before it did not)")
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"))
    ap.add_argument("--out", default=str(ROOT / "results" / "twin-vllm"))
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "twin_vllm.json"))
    return ap.parse_args(argv)


class Campaign:
    def __init__(self, args: argparse.Namespace, command: str):
        self.args, self.out, self.json = args, Path(args.out), Path(args.json)
        self.cfg = load_config(args.config, args.set)
        self.limits, warnings = from_section(self.cfg.continuous)
        for w in warnings:
            print(f"warning: {w}")
        self.cpus = process.split_cores()
        self.record = json.loads(self.json.read_text()) if self.json.is_file() else {}
        self.record |= {"server": args.server, "config": os.path.relpath(args.config, ROOT), "cpus": os.cpu_count(),
                        "pinned": bool(self.cpus), "slo": self.cfg.slo.model_dump(exclude_none=True)}
        self.warm_bursts = args.warm_bursts          # recorded by each part measured after them
        self.whatif_burst = tuple(int(x) for x in args.whatif_burst.split(","))
        self.batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
        self.crowds = tuple(int(k) for k in args.crowds.split(",") if k)
        self.caps = tuple(int(k) for k in args.caps.split(","))      # whatif: each other cap
        self.sizes = tuple(int(k) for k in args.sizes.split(","))    # sizes: requests at once
        self.terms = opt_in_terms(args.with_terms)                    # profile: opt-in step-time terms
        self.cond = self.record.setdefault("conditions", {}).setdefault(args.condition, {})
        self.command = command
        self.moved = False                  # --front-end-on-engine: its twin is written for this profile
        self.running = None                 # the server while one is started (server()): its pid for the contention
        self.started_at = 0.0               # when it answered (monotonic seconds)

    def twin_file(self) -> Path:
        """The twin the parts use: the profile's, or with --front-end-on-engine the same profile with
        its front end on the engine (what `batchlab profile` writes for a server on the CPU)."""
        return self.out / ("twin-front-end-on-engine.yaml" if self.args.front_end_on_engine else "twin.yaml")

    # --- the server -------------------------------------------------------------------------
    @contextmanager
    def server(self, beside: bool = False, **limits):
        """The server with the config's limits (`limits` replacing some), and the config pointed at it;
        `beside`: a second one, on its own port and name, while the first still runs."""
        chosen = self.limits.merged(type(self.limits)(**limits))
        with self.started(chosen, beside) as running:
            self.running, self.started_at = running, time.monotonic()
            cfg = self.cfg.model_copy(update={"backend": self.cfg.backend.model_copy(
                update={"base_url": running.url, "model": running.model})})
            b = self.cfg.backend
            backend = OpenAIBackend(running.url, running.model, timeout_s=b.timeout_s, prompt_format=b.prompt_format,
                                    length_control=b.length_control)
            self.warm(backend)
            yield cfg, backend

    def warm(self, backend) -> None:
        """--warm-bursts saturated bursts, unrecorded: the largest batches and prompt passes the
        server will run, so what it allocates the first time is allocated before any part measures."""
        for k in range(self.args.warm_bursts):
            got = compare.saturated(backend, *BURST)
            print(f"warm-up: burst {k + 1} of {self.args.warm_bursts}: {got['tok_s']:.0f} tok/s", flush=True)

    def started(self, chosen, beside: bool = False):
        """vLLM or transformers serve from their environment, or `batchlab serve` (continuous batching
        on --serve-config's model) with the same limits as `continuous` keys; its queue unbounded, as
        the others' are, so an overloaded point queues rather than gets 429. `beside`: on the port
        after and under another name (a server of the same name would be stopped as an orphan)."""
        shift, suffix = (1, "-beside") if beside else (0, "")
        if self.args.server != "batchlab":
            # NOTE: transformers serve streams text, so its model is tiny-text: every token brings text of its own
            model = "tiny-text" if self.args.server == "transformers" else "tiny"
            cmd, env, url, served = vllm.launch(self.args.server, model, vllm.DEFAULT_PORTS[self.args.server] + shift,
                                                Path(self.args.venv), 1024, "float32", self.cpus, chosen)
            return process.managed(self.args.server + suffix, cmd, url, served, env, self.cpus, 400.0)
        if unsupported := [k for k in chosen.given() if k not in ContinuousConfig.model_fields]:
            raise ConfigError(f"batchlab serve takes its limits as continuous keys, not {', '.join(unsupported)}")
        sets = [f"continuous.{k}={v}" for k, v in chosen.given().items()]
        port = BATCHLAB_PORT + shift
        cmd = process.serve_command(port, "continuous", self.args.serve_config, sets, "tiny", "--max-queue", "100000")
        return process.managed("batchlab-serve-continuous" + suffix, cmd, f"http://127.0.0.1:{port}/v1", "tiny",
                               cpus=self.cpus, wait_s=300)

    def profile_id(self) -> str | None:
        """The profile the twin comes from, by content: a new profile is a new twin even when the
        command that predicts with it is the same."""
        path = self.out / "profile.json"
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else None

    def save(self, part: str, figures: dict) -> None:
        self.cond[part] = {"twin": os.path.relpath(self.twin_file(), ROOT), "profile": self.profile_id()} | figures | {
            "command": self.command, "load_1min_after": os.getloadavg()[0], "warm_bursts": self.warm_bursts}
        self.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.json, json.dumps(self.record, indent=2, default=float) + "\n")

    def twin_path(self) -> Path:
        """twin_file(), written beside twin.yaml the first time it is asked for after a profile."""
        path, moved = self.out / "twin.yaml", self.twin_file()
        if not path.is_file():
            raise ConfigError(f"no twin at {path}: run the profile part first")
        if moved != path and not self.moved:
            moved_profile = self.out / "profile-front-end-on-engine.json"
            prof = json.loads((self.out / "profile.json").read_text())
            write_atomic(moved_profile, json.dumps(prof | {"frontend_on_engine": True}, indent=2) + "\n")
            tree = yaml.safe_load(path.read_text())
            tree["backend"]["profile"] = str(moved_profile.resolve())
            write_atomic(moved, "# twin.yaml's profile with its front end on the engine: requests pass it one at a "
                         "time, taking the engine's time.\n" + yaml.safe_dump(tree, sort_keys=False))
            self.moved = True
        return moved

    def twin(self) -> Twin:
        return Twin(load_config(self.twin_path()))

    # --- the parts --------------------------------------------------------------------------
    def profile(self, cfg) -> None:
        print("profile: the server from the client (black box)", flush=True)
        grid = replace(GRID, batch_sizes=self.batch_sizes, crowds=self.crowds, terms=self.terms)
        twin = profile_server(cfg, grid, self.out / "profile.json", self.out / "twin.yaml", progress=print,
                              hand_over=HandOverProbe(fit=self.args.hand_over_fit))
        self.moved = False                  # a new profile: the moved twin is written again from it
        prof = json.loads((self.out / "profile.json").read_text())
        if "profile" in self.record:         # an earlier profile's figures stay, beside the new one's
            self.record.setdefault("earlier_profiles", []).append(self.record["profile"])
        self.record["profile"] = {"grid": prof["grid"], "fit_rms_rel_error": prof["fit_rms_rel_error"],
                                  "fit_samples": prof["fit_samples"],
                                  "frontend_s": prof.get("frontend_idle_s", prof["frontend_s"]),
                                  "front_end_priced": prof.get("front_end_priced"),
                                  "hand_over": prof.get("hand_over"),
                                  "frontend_spread": prof.get("frontend_spread"),
                                  "frontend_beside_s": prof.get("frontend_beside_s"),
                                  "limits": prof["limits"], "load_1min": prof["setup"]["load_avg_1min"],
                                  "decode_step_s_at_1": twin.backend.cost().step_time(0, 0, 1)}
        if prof["grid"].get("terms"):
            self.record["profile"]["dense_s_per_pair"] = prof.get("dense_s_per_pair", 0.0)
        if prof.get("front_end_priced"):
            self.write_idle_twin(prof)
        self.save("profiled", {})

    def write_idle_twin(self, prof: dict) -> None:
        """twin-front-end-idle.yaml: the same profile with its front end as profiles charged it
        before the arrival probe priced it (the idle reading, all of it on the engine, and what the
        reading beside a stream holds beyond it as a delay), so a validation can be judged on both
        (benchmarks/corrections.py DIR@TWIN)."""
        path = self.out / "profile-front-end-idle.json"
        write_atomic(path, json.dumps(idle_reading(prof), indent=2) + "\n")
        tree = yaml.safe_load((self.out / "twin.yaml").read_text())
        tree["backend"]["profile"] = str(path.resolve())
        write_atomic(self.out / "twin-front-end-idle.yaml", "# twin.yaml's profile with the idle front-end reading on the "
                     "engine instead of the front end the arrivals priced.\n" + yaml.safe_dump(tree, sort_keys=False))

    def knee(self, cfg, backend) -> None:
        a, bracket = self.args, self.bracket()
        settings = compare.Settings(a.config, [], Path(a.venv), cfg.backend.timeout_s, bracket, a.tolerance,
                                    a.max_points, burst=0)
        measured = []
        for rep in range(a.sustain_repeats):
            print(f"knee: search {rep + 1} of {a.sustain_repeats} from {bracket}", flush=True)
            probe = {"probe": compare.saturated(backend, *BURST)} if a.speed_probe else {}
            with self.contention() as taken:
                res = compare.search_server(a.server, backend, cfg, bracket, settings)
            measured.append(res | {"contention": taken} | probe)
            bracket = compare.next_bracket(res, bracket)
        predicted = predicted_knee(self.twin(), cfg.traffic, cfg.slo, self.bracket(), a.tolerance, a.max_points)
        self.save("knee", {"measured": measured, "predicted": predicted} | self.at_contention(measured)
                  | self.at_probe(measured) | self.at_live())

    def at_live(self) -> dict:
        """The knee the twin predicts on the profile its last validation wrote (the live and
        first-token factors pooled over every workload): the machine as its live runs found it."""
        pooled = self.cond.get("validate", {}).get("live", {}).get("pooled", {}).get("server")
        if not pooled or not Path(pooled["profile"]).is_file():
            return {}
        tc, a = load_config(self.twin_path()), self.args
        twin = Twin(tc.model_copy(update={"backend": tc.backend.model_copy(update={"profile": pooled["profile"]})}))
        return {"predicted_at_live": predicted_knee(twin, self.cfg.traffic, self.cfg.slo, self.bracket(), a.tolerance,
                                                    a.max_points)
                | {"factor": pooled["factor"], "first_token": pooled.get("first_token", {}).get("factor", 1.0)}}

    def contention(self):
        """Others' share of the server's cores while it is searched (nothing where it is not pinned:
        its cores would hold the client too)."""
        if not self.cpus:
            return nullcontext({})
        return contention(process.cpu_list(self.cpus), self.running.pid)

    def at_contention(self, measured: list[dict]) -> dict:
        """The twin's knee with its steps scaled by the contention the searches measured (their median)."""
        factors = [m["contention"]["factor"] for m in measured if m.get("contention")]
        if not factors:
            return {}
        a, factor = self.args, statistics.median(factors)
        return {"predicted_at_contention": predicted_knee(replace(self.twin(), scale=factor), self.cfg.traffic, self.cfg.slo,
                                                          self.bracket(), a.tolerance, a.max_points) | {"factor": factor}}

    def at_probe(self, measured: list[dict]) -> dict:
        """The twin's knee with its steps scaled so its saturated burst matches the server's bursts
        measured before the searches (their median tok/s)."""
        probes = [m["probe"]["tok_s"] for m in measured if m.get("probe")]
        if not probes:
            return {}
        a, server = self.args, statistics.median(probes)
        twin = scaled_to_burst(self.twin(), server, *BURST)
        return {"predicted_at_probe": predicted_knee(twin, self.cfg.traffic, self.cfg.slo, self.bracket(), a.tolerance,
                                                     a.max_points) | {"factor": twin.scale, "server_burst_tok_s": server}}

    def validate(self, cfg, backend) -> None:
        rates = self.rates(cfg, backend)
        vcfg = cfg.model_copy(update={"traffic": cfg.traffic.model_copy(update={"rates": rates["base"]}),
                                      "validation": cfg.validation.model_copy(update={"workloads": {
                                          w: t | {"rates": rates[w]} for w, t in cfg.validation.workloads.items()}})})
        where = self.out / self.args.condition / "validate"
        print(f"validate: rates {rates}", flush=True)
        v = validate(vcfg, [], where, progress=print, twin=str(self.twin_path()))
        for line in report_lines(v):
            print(line)
        acc = json.loads((where / "accuracy.json").read_text())
        earlier = self.cond.get("validate")
        if earlier and ((earlier.get("profile"), earlier.get("twin")) != (self.profile_id(), os.path.relpath(self.twin_file(), ROOT))
                        or earlier.get("metrics") != acc["metrics"]):
            # the same real runs replayed on an earlier twin, or judged by an earlier validate: kept beside
            self.cond.setdefault("earlier_validations", []).append(
                {k: earlier[k] for k in ("metrics", "signs", "coverage", "drift", "live", "uncorrected", "command", "twin", "rates")
                 if k in earlier})
        cells = self.keep_cells(where)
        self.save("validate", {"rates": rates, "metrics": acc["metrics"], "drift": acc["drift"], "load_1min": acc["load_1min"],
                               "live": acc.get("live", {}), "uncorrected": acc["uncorrected"], "signs": sides(v.cells),
                               "by_workload": acc.get("by_workload", {}), "cells_file": cells,
                               "coverage": float(v.cells["inside"].mean()), "cells": len(v.cells)}
                  | ({"without_live": self.without_live(vcfg, where)} if vcfg.validation.live else {}))

    def keep_cells(self, where: Path) -> str:
        """A copy of the validation's cells beside --json (cells/STEM-CONDITION.csv): the real runs
        under --out are not versioned, and every rule that judges them again needs these rows."""
        dst = self.json.parent / "cells" / f"{self.json.stem.replace('_', '-')}-{self.args.condition}.csv"
        dst.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dst, (where / "validation.csv").read_text())
        return os.path.relpath(dst, ROOT)

    def without_live(self, vcfg, where: Path) -> dict:
        """The same real runs replayed with the drift probe alone (no live or first-token factor),
        in a copy of the validation's directory: what those two earn."""
        import shutil
        copy = where.parent / "validate-without-live"
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(where, copy)
        alone = {"live": False, "first_token": "off", "drift": "apply" if vcfg.validation.drift_timed else "off"}
        off = vcfg.model_copy(update={"validation": vcfg.validation.model_copy(update=alone)})
        v = validate(off, [], copy, twin=str(self.twin_path()))
        acc = json.loads((copy / "accuracy.json").read_text())
        return {"metrics": acc["metrics"], "signs": sides(v.cells), "coverage": float(v.cells["inside"].mean())}

    def rates(self, cfg, backend) -> dict[str, list[float]]:
        """Each workload's validation rates: --fractions of what the server completes saturated on
        that workload's own requests (a burst of SATURATION of them at once), so every point sits
        below capacity, where the trace, not the server, sets the throughput. Kept once chosen, so
        a resumed validation runs the same points."""
        path = self.out / self.args.condition / "rates.json"
        if path.is_file():
            return json.loads(path.read_text())["rates"]
        saturated, snap = {}, significant(3)
        for w in ["base", *cfg.validation.workloads]:
            _, trace = burst_trace(cfg.workload(w).traffic, SATURATION)
            saturated[w] = saturated_rate(compare.sent(backend, trace))
            print(f"validate: {w}: {saturated[w]:.3g} req/s saturated", flush=True)
        rates = {w: [snap(f * r) for f in self.fractions()] for w, r in saturated.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"saturated_req_s": saturated, "rates": rates}, indent=2) + "\n")
        return rates

    def whatif_here(self, backend, cap: int) -> dict:
        n, p, o = self.whatif_burst
        runs = [compare.saturated(backend, n, p, o) for _ in range(self.args.whatif_runs)]
        print(f"whatif: cap {cap}: measured {[round(r['tok_s']) for r in runs]} tok/s, "
              f"TPOT p50 {[round(1e3 * r['tpot_p50'], 1) for r in runs]} ms", flush=True)
        return {"cap": cap, "measured": runs, "predicted": predicted_burst(self.twin(), n, p, o, max_num_seqs=cap)}

    def burst_sizes(self, backend) -> None:
        """Bursts of each of --sizes requests at once on the server, and on the twin, each judged
        over its whole span (a burst that the server runs at once has no steady middle)."""
        (_, p, o), twin, rows = self.whatif_burst, self.twin(), []
        for n in self.sizes:
            runs = [self.sized_burst(backend, n, p, o) for _ in range(self.args.whatif_runs)]
            rows.append({"requests": n, "measured": runs, "predicted": predicted_whole_burst(twin, n, p, o)})
            t = rows[-1]["predicted"]
            print(f"sizes: {n} at once: measured {[round(r['span_tok_s']) for r in runs]} tok/s, median gap "
                  f"{[round(1e3 * r['gap_p50'], 1) for r in runs]} ms, {[round(r['rows_mean']) for r in runs]} rows at once, "
                  f"last first token {[round(r['ttft_max'], 2) for r in runs]} s, server CPU "
                  f"{[round(r.get('server_cpu_share', math.nan), 2) for r in runs]} of the span; twin {t['span_tok_s']:.0f} "
                  f"tok/s, {1e3 * t['gap_p50']:.1f} ms, {t['rows_mean']:.0f} rows, {t['ttft_max']:.2f} s", flush=True)
        self.save("sizes", {"burst": {"prompt": p, "output": o}, "batch_sizes_profiled": list(self.profiled_sizes()),
                            "sizes": rows})

    def sized_burst(self, backend, n: int, p: int, o: int) -> dict:
        """One burst of n at once on the server (whole_burst), with the CPU time the server's processes
        spent meanwhile: its share of the wall time says whether the server computed all along
        (near 1 on its one core) or waited."""
        before, t0 = usage(self.running.pid), time.monotonic()
        got = whole_burst(compare.sent(backend, fixed_burst(n, p, o)), o)
        after, wall = usage(self.running.pid), time.monotonic() - t0
        if not (before and after):
            return got
        cpu = after.since(before)
        return got | {"server_cpu_s": cpu.user_s + cpu.system_s, "server_cpu_share": (cpu.user_s + cpu.system_s) / wall}

    def profiled_sizes(self) -> tuple[int, ...]:
        """The decode bursts' sizes of the profile the twin comes from."""
        return tuple(json.loads((self.out / "profile.json").read_text())["grid"]["batch_sizes"])

    def whatif_paired(self, cap: int) -> tuple[list[dict], dict]:
        """--whatif-pairs pairs of bursts alternating between a server at the profile's cap and one at
        `cap`, both up at once, in ABBA order. Each burst records the CPU seconds the waiting server
        spent meanwhile (`beside_cpu_s`, over the burst's `wall_s`): what sharing the core cost.
        Returns the control's runs and the cap's entry, its `control` the runs paired with its own."""
        n, p, o = self.whatif_burst
        own = self.cfg.continuous.max_num_seqs
        with self.server() as (_, control):
            first = self.running
            with self.server(beside=True, max_num_seqs=cap) as (_, other):
                both = {own: (control, self.running), cap: (other, first)}
                runs: dict[int, list[dict]] = {own: [], cap: []}
                for k in range(self.args.whatif_pairs):
                    for c in ((own, cap) if k % 2 == 0 else (cap, own)):
                        backend, waiting = both[c]
                        before, t0 = usage(waiting.pid), time.monotonic()
                        got = compare.saturated(backend, n, p, o) | {"wall_s": time.monotonic() - t0}
                        if before and (after := usage(waiting.pid)):
                            got["beside_cpu_s"] = after.user_s + after.system_s - before.user_s - before.system_s
                        runs[c].append(got)
        print(f"whatif: cap {own} beside cap {cap}: measured {[round(r['tok_s']) for r in runs[own]]} and "
              f"{[round(r['tok_s']) for r in runs[cap]]} tok/s", flush=True)
        return runs[own], {"cap": cap, "measured": runs[cap], "control": runs[own],
                           "predicted": predicted_burst(self.twin(), n, p, o, max_num_seqs=cap)}

    def alternate(self, cfg, backend) -> None:
        """Base and --alternate-with alternately from the server's start (see the module's docstring)."""
        a, twin = self.args, self.twin()
        rates, points = self.middle_rates(cfg), []
        for k in range(2 * a.alternate_pairs):
            w = a.alternate_with if k % 2 else "base"
            wc = cfg.workload(w)
            host = host_speed()
            t, age, before, stolen = wc.traffic, time.monotonic() - self.started_at, usage(self.running.pid), stolen_s()
            _, reqs = open_loop(backend, t, rates[w], wc.slo)
            after, stolen = usage(self.running.pid), (stolen_s() or 0.0) - (stolen or 0.0)
            predicted = twin.replay(build_trace(t, rates[w]), t, wc.slo, rates[w])
            points.append({"workload": w, "rate": rates[w], "server_age_s": age, "host": host, "stolen_s": stolen,
                           "server": point_figures(reqs, t.warmup_s, t.duration_s),
                           "twin": point_figures(predicted, t.warmup_s, t.duration_s)}
                          | ({"usage": asdict(after.since(before))} if before and after else {}))
            p = points[-1]
            print(f"alternate: {w} at {rates[w]:g} req/s ({age:.0f} s after the start): p50 TPOT "
                  f"{1e3 * p['server']['tpot_p50']:.2f} ms, twin {1e3 * p['twin']['tpot_p50']:.2f} ms; stood still "
                  f"{p['server']['stalled_s']:.2f} s; {p.get('usage', {}).get('minor_faults', '-')} page faults", flush=True)
        self.save("alternate", {"with": a.alternate_with, "points": points, "summary": {
            key: alternation(points, key) for key in ("tpot_p50", "e2e_p50", "ttft_p50")}})

    def middle_rates(self, cfg) -> dict[str, float]:
        """Base's and --alternate-with's middle validation rate on this condition (rates.json), or
        the config's first base rate for both where no validation has chosen them."""
        path, w = self.out / self.args.condition / "rates.json", self.args.alternate_with
        if path.is_file():
            rates = json.loads(path.read_text())["rates"]
            return {k: rates[k][len(rates[k]) // 2] for k in ("base", w)}
        return dict.fromkeys(("base", w), cfg.traffic.rates[0])

    def request_costs(self, backend) -> None:
        """What one request costs the others, on the server (--request-rounds rounds) and on its
        twin (once: virtual time): an arrival among running streams, and a finish
        (calibrate/twin_check.py arrival_cost, finish_cost)."""
        run = functools.partial(compare.sent, backend)
        rounds = []
        for k in range(self.args.request_rounds):
            rounds.append(self.costs(run))
            print(f"requests: round {k}: an arrival {1e3 * rounds[-1]['arrival_s']:.2f} ms "
                  f"({rounds[-1]['arrival_steps']:.2f} steps), in clumps of {CLUMP} {1e3 * rounds[-1]['clump_arrival_s']:.2f} ms, "
                  f"staying {1e3 * rounds[-1]['stay_arrival_s']:.2f} ms, a long prompt {1e3 * rounds[-1]['long_arrival_s']:.2f} ms, "
                  f"a finish {1e3 * rounds[-1]['finish_s']:.2f} ms", flush=True)
        self.save("requests", {"rounds": rounds, "predicted": self.costs(self.twin().replay)})

    @staticmethod
    def costs(run) -> dict:
        """One round of the request probes on `run` (a server's client or a twin's replay)."""
        return (arrival_cost(run) | arrival_cost(run, CLUMP) | arrival_cost(run, CLUMP, STAY, "stay_")
                | arrival_cost(run, 1, LONG_ARRIVAL, "long_") | finish_cost(run))

    def row_costs(self, backend) -> None:
        """What one short arrival costs the running streams by how many run (ROWS), arriving one at
        a time and in clumps of CLUMP, and a long-prompt one (LONG_ARRIVAL): --request-rounds rounds
        on the server, each in another order, and once on the twin. A cost per arrival that grows
        with the rows beyond what the twin's steps charge shows here, and clumps show whether one
        prompt step shares it."""
        run = functools.partial(compare.sent, backend)
        probes = [(n, k, short) for n in ROWS for k, short in ((1, SHORT), (CLUMP, SHORT), (1, LONG_ARRIVAL))]
        key = lambda n, k, short: f"{n}x{k}" + ("" if short == SHORT else f"x{short[0]}")  # noqa: E731
        rounds, inside = [], []
        for r in range(self.args.request_rounds):
            order = probes[r % len(probes):] + probes[:r % len(probes)]
            got = {key(*p): arrival_seconds(run, p[1], p[2], (p[0], LONG_PROMPT, LONG_OUTPUT)) for p in order}
            rounds.append({key: v[0] for key, v in got.items()})
            inside.append({key: v[4] for key, v in got.items()})
            print(f"rows: round {r}: " + ", ".join(f"{key} {1e3 * v[0]:.2f} ms ({1e3 * v[4]:.2f} within)"
                                                   for key, v in got.items()), flush=True)
        twin = self.twin()
        steps = Twin(twin.cfg, cost=bare(twin.cfg.backend.cost())).replay     # the fitted steps, no front end
        on = {name: {key(*p): arrival_seconds(t, p[1], p[2], (p[0], LONG_PROMPT, LONG_OUTPUT))[0] for p in probes}
              for name, t in (("twin", twin.replay), ("steps", steps))}
        # in virtual time the machine never moves, so the twin's reading inside one run is its two-run one
        self.save("rows", {"streams": list(ROWS), "clump": CLUMP, "short": list(SHORT), "long": list(LONG_ARRIVAL),
                           "rounds": rounds, "rounds_within": inside, "predicted": on["twin"],
                           "predicted_steps": on["steps"]})

    def contention_check(self, backend) -> None:
        """Saturated bursts quiet and beside the background load (the server's core, every core), in
        rotating order, each with the share of the server's core others took; per round the slowdown
        against that round's quiet burst, beside what the share alone explains."""
        n, p, o = BURST
        server = process.cpu_list(self.cpus)
        where = {"quiet": [], "server core": server, "every core": list(range(os.cpu_count() or 1))}
        rounds = []
        for k in range(self.args.contention_rounds):
            names = list(where)[k % 3:] + list(where)[:k % 3]
            got = {}
            for name in names:
                with ExitStack() as stack:
                    if where[name]:
                        stack.enter_context(background_load(where[name], self.args.busy_duty))
                    taken = stack.enter_context(self.contention())
                    got[name] = compare.saturated(backend, n, p, o)
                got[name]["others_share"] = taken.get("others_share")
            for name in ("server core", "every core"):
                got[name] |= {"slowdown": got["quiet"]["tok_s"] / got[name]["tok_s"],
                              "explained": 1 / (1 - got[name]["others_share"])}
            print("contention: " + "; ".join(f"{k} {v['tok_s']:.0f} tok/s, others {100 * v['others_share']:.1f} %"
                                             for k, v in got.items()), flush=True)
            rounds.append(got)
        self.save("contention", {"burst": dict(zip(("requests", "prompt", "output"), BURST)),
                                 "duty": self.args.busy_duty, "rounds": rounds})

    # --- helpers ----------------------------------------------------------------------------
    def bracket(self) -> tuple[float, float]:
        lo, hi = (float(x) for x in self.args.bracket.split(","))
        return lo, hi

    def fractions(self) -> list[float]:
        return [float(x) for x in self.args.fractions.split(",")]


# what `save` writes anew for a part predicted again: the command, the load, and the twin and the
# profile the new predictions come from (kept, they would name the earlier ones)
REMADE = ("command", "load_1min_after", "twin", "profile")


def same_figures(a: dict, b: dict) -> bool:
    """Two predictions with the same keys and the same numbers to 1e-9 (a replay of the same twin
    on a different machine differs in the last bits of its floating-point sums)."""
    return a.keys() == b.keys() and all(
        math.isclose(a[k], b[k], rel_tol=1e-9) if isinstance(a[k], float) else a[k] == b[k] for k in a)


def predict_again(c: Campaign, parts: list[str]) -> None:
    """The twin's figures for the knee and the what-if from the current twin, beside the server's
    figures measured earlier (kept as they are): what a new profile predicts for the same runs."""
    a, twin, kept = c.args, c.twin(), c.cond
    other = {part: kept.get(part, {}).get("command") != c.command or kept.get(part, {}).get("profile") != c.profile_id()
             for part in ("knee", "whatif")}       # another command or another profile made what is there
    if "knee" in parts:
        cfg = c.cfg
        before = kept["knee"]["predicted"]
        kept["knee"]["predicted"] = predicted_knee(twin, cfg.traffic, cfg.slo, c.bracket(), a.tolerance, a.max_points)
        if other["knee"] and before["probes"] != kept["knee"]["predicted"]["probes"]:
            # an earlier twin's prediction that differs stays beside (a rerun of the same one replaces)
            scaled = {k: kept["knee"][k] for k in ("predicted_at_probe", "predicted_at_contention") if k in kept["knee"]}
            kept["knee"].setdefault("earlier_predictions", []).append(before | {"by": kept["knee"]["command"]} | scaled)
        # the contention and the bursts the searches measured, on this twin
        kept["knee"] |= c.at_contention(kept["knee"]["measured"]) | c.at_probe(kept["knee"]["measured"]) | c.at_live()
        drift = kept.get("validate", {}).get("drift", {}).get("base", {}).get("server")
        if drift:           # the machine as the validation's reference bursts found it (its base workload)
            kept["knee"]["predicted_at_drift"] = predicted_knee(replace(twin, scale=drift["factor"]), cfg.traffic, cfg.slo,
                                                                c.bracket(), a.tolerance, a.max_points) | {"factor": drift["factor"]}
        c.save("knee", {k: v for k, v in kept["knee"].items() if k not in REMADE}
               | {"measured_by": kept["knee"].get("measured_by", kept["knee"]["command"])})
    if "whatif" in parts:
        n, p, o = (kept["whatif"]["burst"][k] for k in ("requests", "prompt", "output"))
        for cap in kept["whatif"]["caps"]:
            new = predicted_burst(twin, n, p, o, max_num_seqs=cap["cap"])
            if other["whatif"] and not same_figures(new, cap["predicted"]):   # as for the knee: one the same is not kept twice
                cap.setdefault("earlier_predictions", []).append(cap["predicted"] | {"by": kept["whatif"]["command"]})
            cap["predicted"] = new
        c.save("whatif", {k: v for k, v in kept["whatif"].items() if k not in REMADE}
               | {"measured_by": kept["whatif"].get("measured_by", kept["whatif"]["command"])})


def run(c: Campaign, parts: list[str]) -> None:
    a = c.args
    if a.predict_only:
        return predict_again(c, parts)
    if "alternate" in parts and a.alternate_with not in c.cfg.validation.workloads:
        raise ConfigError(f"--alternate-with {a.alternate_with}: not one of the config's held-out workloads "
                          f"({', '.join(c.cfg.validation.workloads) or 'none'})")
    if a.warm_bursts < 0:
        raise ConfigError(f"--warm-bursts: want 0 or more, got {a.warm_bursts}")
    if a.alternate_pairs < 1:
        raise ConfigError(f"--alternate-pairs: want at least 1, got {a.alternate_pairs}")
    if "whatif" in parts and a.whatif_pairs and c.cfg.continuous.max_num_seqs in c.caps:
        raise ConfigError(f"--caps {a.caps}: the profile's cap {c.cfg.continuous.max_num_seqs} is every pair's "
                          "control; name only other caps (or --whatif-pairs 0)")
    if "profile" not in parts and (needing := [p for p in parts if p in TWIN_PARTS]) and not (c.out / "twin.yaml").is_file():
        # NOTE: before the server starts and a part measures for minutes, not after
        raise ConfigError(f"--parts {','.join(needing)}: no twin at {c.out / 'twin.yaml'}: run the profile part first")
    if "contention" in parts and not c.cpus:     # NOTE: before the server starts, not after
        raise ConfigError("--parts contention needs the server pinned to its own core (two cores and taskset)")
    with ExitStack() as stack:
        if a.condition == "busy":
            load = stack.enter_context(background_load(list(range(os.cpu_count() or 1)), a.busy_duty))
            c.record["conditions"]["busy"]["background"] = {k: v for k, v in load.items() if k != "pids"}
        # every part measures on this server but the paired what-if, which starts its own
        first = [p for p in parts if p != "whatif" or not a.whatif_pairs]
        cfg, backend = stack.enter_context(c.server()) if first else (None, None)
        if "alternate" in parts:
            c.alternate(cfg, backend)
        if "profile" in parts:
            c.profile(cfg)
        if "knee" in parts:
            c.knee(cfg, backend)
        if "validate" in parts:
            c.validate(cfg, backend)
        whatif = [c.whatif_here(backend, c.cfg.continuous.max_num_seqs)] if "whatif" in parts and not a.whatif_pairs else []
        if "contention" in parts:
            c.contention_check(backend)
        if "requests" in parts:
            c.request_costs(backend)
        if "rows" in parts:
            c.row_costs(backend)
        if "sizes" in parts:
            c.burst_sizes(backend)
    burst = {"burst": dict(zip(("requests", "prompt", "output"), c.whatif_burst))}
    if "whatif" in parts and a.whatif_pairs:
        return whatif_in_pairs(c, burst)
    for cap in (c.caps if "whatif" in parts else ()):
        with c.server(max_num_seqs=cap) as (_, backend):
            whatif.append(c.whatif_here(backend, cap))
        c.save("whatif", burst | {"caps": whatif})


def whatif_in_pairs(c: Campaign, burst: dict) -> None:
    """The what-if cap by cap beside a server at the profile's cap (Campaign.whatif_paired); the
    first entry pools every control burst, each other its own pairs. Saved after each cap."""
    n, p, o = c.whatif_burst
    own = {"cap": c.cfg.continuous.max_num_seqs, "measured": [],
           "predicted": predicted_burst(c.twin(), n, p, o, max_num_seqs=c.cfg.continuous.max_num_seqs)}
    entries = [own]
    for cap in c.caps:
        control, entry = c.whatif_paired(cap)
        own["measured"] += control
        entries.append(entry)
        c.save("whatif", burst | {"pairs": c.args.whatif_pairs, "caps": entries})


@user_errors
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    parts = args.parts.split(",")
    if unknown := [p for p in parts if p not in PARTS]:
        raise ConfigError(f"--parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    try:
        lo, hi = (float(x) for x in args.bracket.split(","))
    except ValueError:
        raise ConfigError(f"--bracket: want LO,HI in req/s, got {args.bracket!r}") from None
    if not 0 < lo < hi:
        raise ConfigError(f"--bracket: want 0 < LO < HI, got {args.bracket!r}")
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise ConfigError(f"--batch-sizes: want whole numbers separated by commas, got {args.batch_sizes!r}") from None
    if min(sizes) < 1:
        raise ConfigError(f"--batch-sizes: want sizes of 1 or more, got {args.batch_sizes!r}")
    if not all(k.strip().isdigit() and int(k) > 0 for k in args.caps.split(",")):
        raise ConfigError(f"--caps: want whole numbers above 0 separated by commas, got {args.caps!r}")
    if not all(k.strip().isdigit() and int(k) > 0 for k in args.sizes.split(",")):
        raise ConfigError(f"--sizes: want whole numbers above 0 separated by commas, got {args.sizes!r}")
    if not all(k.isdigit() and int(k) > 0 for k in args.crowds.split(",") if k):
        raise ConfigError(f"--crowds: want whole numbers above 0 separated by commas, got {args.crowds!r}")
    if args.whatif_pairs < 0:
        raise ConfigError(f"--whatif-pairs: want 0 or more, got {args.whatif_pairs}")
    if args.whatif_runs < 1:
        raise ConfigError(f"--whatif-runs: want at least 1, got {args.whatif_runs}")
    burst = args.whatif_burst.split(",")
    if len(burst) != 3 or not all(x.isdigit() and int(x) > 0 for x in burst):
        raise ConfigError(f"--whatif-burst: want N,PROMPT,OUTPUT as three whole numbers above 0, got {args.whatif_burst!r}")
    if "contention" in parts and args.condition == "busy":
        raise ConfigError("--parts contention runs its own background load beside quiet bursts; "
                          "run it with --condition quiet")
    command = " ".join(["python benchmarks/twin.py", *(argv if argv is not None else sys.argv[1:])])
    c = Campaign(args, command.replace(str(ROOT) + "/", ""))
    run(c, parts)
    print(f"wrote {c.json}")


if __name__ == "__main__":
    main()
