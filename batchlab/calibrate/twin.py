"""A twin of a server: the simulator set up to serve as that server does.

A twin is two files: the profile (the step-time model and front end fitted from the server's
streams, calibrate/blackbox.py) and a run config, `twin.yaml`, whose simulator runs that profile
under continuous batching with the server's own limits: sequences and tokens per step, chunked
prefill, prefix caching, KV blocks and their size. Each limit comes from the most direct source
there is, and twin.yaml says which: what the server publishes about itself (vLLM's /metrics cache
info), the flags batchlab started it with (`batchlab vllm up` records them), the config's own
`continuous` section (what the user says the server runs with: `batchlab serve` takes that very
section), or, for a vLLM server that publishes none, vLLM's documented default. `batchlab run
twin.yaml` then simulates the server; `batchlab validate CONFIG --twin twin.yaml` checks it.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from batchlab.backends.cost import StepCost
from batchlab.calibrate import handover
from batchlab.calibrate.blackbox import BlackBoxProfile, ProbeGrid
from batchlab.calibrate.fit import Fit, StepSample, fit_step_times, fit_terms, samples_from
from batchlab.calibrate.front_end import ArrivalProbe, bare, front_end, nested, with_front_end
from batchlab.calibrate.handover import HandOverProbe
from batchlab.calibrate.twin_check import Twin
from batchlab.core.config import RunConfig
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError
from batchlab.run.config import validate
from batchlab.schedulers import ContinuousConfig, ContinuousScheduler

# vLLM's defaults for its OpenAI server where nothing says otherwise: they differ by platform
# (CPU: 128 sequences and a 2048-token budget; H100-class GPUs: 1024 and 8192), these are its
# defaults on most GPUs. V1 schedules chunked prefill and caches prefixes unless told not to.
VLLM_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "block_size": 16, "prefix_caching": True}


@dataclass(frozen=True)
class Limit:
    value: Any
    source: str                  # where it was read: "server /server_info", "server /metrics", "runs with"
                                 # (batchlab's record), "started with", "config" or "vLLM default"


def limits(cfg: RunConfig, published: dict[str, Any], started: dict[str, Any] | None,
           stated: dict[str, Any] | None = None) -> dict[str, Limit]:
    """The server's scheduler limits as continuous-section keys, each from the most direct source:
    what the server states (`stated`: its /server_info, already in continuous-section names; then
    `published`: its /metrics labels) over what batchlab recorded starting it (`started`: the
    state record, what it says it runs with over what it was asked for) over, for a vLLM, its
    defaults, over the config's own section."""
    started = started or {}
    out = {k: Limit(v, "config") for k, v in cfg.continuous.model_dump().items() if k != "preemption"}
    if "num_gpu_blocks" in published or started.get("server") == "vllm" or stated and stated.get("server") != "batchlab":
        out |= {k: Limit(v, "vLLM default") for k, v in VLLM_DEFAULTS.items()}
        out["chunk_size"] = Limit(VLLM_DEFAULTS["max_num_batched_tokens"], "vLLM default (chunked prefill)")
    for record, source in ((started.get("asked"), "started with"), (started.get("runs_with"), "runs with"),
                           (stated, "server /server_info")):
        out |= {k: Limit(v, source) for k, v in (record or {}).items() if k in ContinuousConfig.model_fields}
        if (record or {}).get("chunked_prefill") is False:
            out["chunk_size"] = Limit(None, source)
        elif record and "max_num_batched_tokens" in record and out["chunk_size"].source.startswith("vLLM default"):
            out["chunk_size"] = Limit(record["max_num_batched_tokens"], f"{source} (chunked prefill)")
    if (stated or {}).get("device"):
        out["device"] = Limit(stated["device"], "server /server_info")
    out |= _published(published)
    return out


def _published(metrics: dict[str, Any]) -> dict[str, Limit]:
    """The limits among a server's /metrics labels (vLLM's cache_config_info)."""
    out = {}
    if str(metrics.get("num_gpu_blocks", "")).isdigit():
        out["num_kv_blocks"] = Limit(int(metrics["num_gpu_blocks"]), "server /metrics")
    if str(metrics.get("block_size", "")).isdigit():
        out["block_size"] = Limit(int(metrics["block_size"]), "server /metrics")
    if metrics.get("enable_prefix_caching") in ("True", "False"):
        out["prefix_caching"] = Limit(metrics["enable_prefix_caching"] == "True", "server /metrics")
    return out


def write_twin(cfg: RunConfig, prof: BlackBoxProfile, grid: ProbeGrid, setup: dict[str, Any],
               found: dict[str, Limit], profile_path: Path, twin_path: Path,
               arrivals: ArrivalProbe | None = None, hand_over: HandOverProbe | None = None) -> RunConfig:
    """Write the profile JSON and twin.yaml (the profile first: the config names it); returns the
    twin. With the server's arrival costs (prof.arrivals, from `arrivals`), the front end's engine
    time is priced from them (calibrate/front_end.py); else the idle reading is the front end. With
    the server's engine steps on a burst (prof.hand_over, from `hand_over`), the profile records how
    the burst's prompts split on the server and on the twin, and where the probe asks (`fit`) the
    twin takes the engine time that splits them as the server did (calibrate/handover.py)."""
    kv = found.get("num_kv_blocks")
    block = int(found["block_size"].value)
    base = StepCost(0, 0, 0, 0, 0, kv_bytes_per_token=1,
                    kv_budget_bytes=(kv.value * block) if kv and kv.value else 1 << 40)
    front, beyond = front_end_parts(prof.frontend_s, prof.frontend_beside_s)
    cost = replace(prof.fit.to_cost(base), frontend_s=front, first_token_s=beyond, frontend_on_engine=on_engine(found),
                   name=f"twin of {cfg.backend.model}",
                   description=f"black-box profile of {cfg.backend.model} at {cfg.backend.base_url} "
                               f"(fit rms error {100 * prof.fit.rms_rel_error:.1f}%)")
    tree = twin_tree(cfg, profile_path, found)
    twin = validate(tree, f"{twin_path}: ")
    priced = {}
    if prof.arrivals and arrivals:
        fe = front_end(prof.arrivals, Twin(twin, cost=bare(cost)).replay, front + beyond, arrivals)
        cost = with_front_end(cost, fe)
        priced = {"front_end_priced": fe.record() | {"probe": asdict(arrivals), "rounds_s": nested(prof.arrivals),
                                                     "read": "inside one run"}}
    if prof.hand_over and hand_over:
        cost, priced["hand_over"] = handed_over(cost, prof.hand_over, hand_over, twin, front + beyond, front)
    pred = prof.fit.predict(prof.samples)
    rows = [asdict(s) | {"fit_seconds": float(p)} for s, p in zip(prof.samples, pred)]
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    cost.to_json(profile_path, level="iteration", **prof.fit.summary(), grid=asdict(grid), setup=setup,
                 samples=rows, frontend_idle_s=prof.frontend_s, frontend_spread=prof.frontend_spread,
                 frontend_beside_s=prof.frontend_beside_s, **priced,
                 reference_gaps_s=prof.reference_s,
                 reference_burst_s=prof.reference_burst_s,
                 **({"decode_read_whole": prof.read_whole} if prof.read_whole else {}),
                 **({"decode_unread": prof.unread} if prof.unread else {}),
                 limits={k: asdict(v) for k, v in found.items()})
    write_atomic(twin_path, _header(cfg, found) + yaml.safe_dump(tree, sort_keys=False))
    return twin


def refitted(record: dict, samples: list[StepSample], without: tuple[str, ...] = (), twin: RunConfig | None = None,
             fit: Fit | None = None) -> dict:
    """A saved black-box profile (its JSON record) with its step-time terms fitted again on
    `samples` (the terms in `without` held at zero) and its front end priced again from the
    profile's own arrival readings against the new steps, as write_twin prices it: what the
    profile would have held had it been fitted so, without asking the server again. The arrival
    probe is replayed under `twin` (default: continuous batching with the limits the profile read).
    NOTE: the idle front-end reading stays as the profile took it (time to first token less the
    fitted prompt pass, over probes the profile does not keep): a refit that moves a one-prompt
    pass by x moves what a new profile would read by -x (on vLLM, dropping admit_s: 0.1-0.7 ms of 4.9).
    `fit`: that fit, where the caller already made it."""
    fit = fit or fit_step_times(samples, without, fit_terms(record))
    if twin is None:
        section = {k: v["value"] for k, v in record.get("limits", {}).items() if k in ContinuousConfig.model_fields}
        twin = validate({"strategies": [ContinuousScheduler.name], ContinuousScheduler.name: section}, "refit: ")
    front, beyond = front_end_parts(record.get("frontend_idle_s", record["frontend_s"]), record.get("frontend_beside_s"))
    cost = replace(fit.to_cost(StepCost.from_record(record)), frontend_s=front, first_token_s=beyond,
                   frontend_s_per_token=0.0, admit_s_per_row=0.0)
    priced = {}
    if (old := record.get("front_end_priced")) and "rounds_s" in old:
        arrivals = {(int(n), int(p)): v for n, by in old["rounds_s"].items() for p, v in by.items()}
        probe = ArrivalProbe(**{k: tuple(v) if isinstance(v, list) else v for k, v in old["probe"].items()})
        fe = front_end(arrivals, Twin(twin, cost=bare(cost)).replay, front + beyond, probe)
        cost = with_front_end(cost, fe)
        priced = {"front_end_priced": fe.record() | {k: old[k] for k in ("probe", "rounds_s", "read") if k in old}}
    if read := handover.from_record(record):
        cost, priced["hand_over"] = handed_over(cost, *read, twin, front + beyond, front)
    rows = [asdict(s) | {"fit_seconds": float(p)} for s, p in zip(samples, fit.predict(samples))]
    return record | asdict(cost) | fit.summary() | priced | {
        "samples": rows, "refitted": {"without": list(without), "samples": len(samples), "from": len(record["samples"])}}


def handed_over(cost: StepCost, server: list[dict[str, float]], probe: HandOverProbe, twin: RunConfig,
                before_s: float, idle_s: float) -> tuple[StepCost, dict]:
    """The step model with the hand-over fit applied where `probe` asks for it, and the fit's record.
    The fit tries engine times up to handover.GRID_TOP_S, or twice the idle reading where more."""
    found = handover.fit(server, Twin(twin), cost, before_s, probe, max(handover.GRID_TOP_S, 2 * idle_s))
    return handover.applied(cost, found, before_s), found.record()


def front_end_parts(idle_s: float, beside_s: float | None) -> tuple[float, float]:
    """(front end, delay beyond it) for a twin, from the profile's two readings: the idle one
    (time to first token less the fitted prompt pass) is the front end, the part that can take
    the engine's processor; what a prompt sent beside a stream spends before the scheduler
    beyond that (the way back to the client, waiting between processes) delays each request
    off the engine. On vLLM on one core the two read 1.5 and 4.6 ms, and a held-out validation
    replayed on that split without any correction came within 6.9 / 5.2 / 7.5 % (p50 E2E / TTFT
    / TPOT), against 6.3 / 7.8 / 7.8 % with the idle reading alone (TTFT below in 92 % of cells)
    and 14.7 / 12.8 / 14.0 % with the beside reading as the front end (docs/results/twin.md,
    "The front end in two parts")."""
    return idle_s, (max(0.0, beside_s - idle_s) if beside_s is not None else 0.0)


def beyond_the_profile(profile: dict) -> dict:
    """A saved profile (its JSON) whose decode rows past its largest measured batch grow the step
    as its top two batch sizes grew beyond the lines (StepCost `beyond_s_per_row`): each size's
    median decode step over what the lines alone give it, the difference per row between the two.
    NOTE: a what-if at a cap above the profile's extrapolates, and the lines' slope comes mostly
    from the small batches, which hold most of the steps. An estimate from two batch sizes is as
    noisy as they are: on vLLM on one core, one profile's top batches grew faster than its lines and
    carried on put the decode step at 128 rows within 7 % of vLLM's (the lines 10 % short); another's
    grew slower, where its lines were 4 % off."""
    lines = replace(StepCost.from_record(profile), shape_s=(), beyond_s_per_row=0.0)
    decode = [s for s in samples_from(profile["samples"]) if s.kind == "decode"]
    sizes = sorted({s.decode_rows for s in decode})
    if len(sizes) < 2:
        raise ConfigError("the profile has decode steps at fewer than two batch sizes: nothing to carry past them")
    below, top = sizes[-2:]
    over = {b: statistics.median(s.seconds - lines.step_time(s.context_tokens, 0, b) for s in decode if s.decode_rows == b)
            for b in (below, top)}
    return profile | {"rows_profiled": int(top), "beyond_s_per_row": (over[top] - over[below]) / (top - below)}


def rows_past(fitted: dict, samples: list[StepSample], rows: int) -> dict:
    """A profile (its JSON) fitted on the steps of at most `rows` decode rows, its decode rows past
    them priced from the profile's decode steps of more (StepCost `beyond_s_per_row` from `rows`):
    the least-squares slope through zero of those steps' time over the fit's against their rows
    past `rows`. So the prompt terms stay as the small steps set them, and the big steps add only
    to what a row costs past `rows`.
    NOTE: one slope for every row past: where the step bends more as rows grow, it splits the
    difference between the sizes (a refit's table shows each)."""
    fit = replace(StepCost.from_record(fitted), beyond_s_per_row=0.0)
    past = [s for s in samples if s.kind == "decode" and s.decode_rows > rows]
    if not past:
        raise ConfigError(f"the profile has no decode step of more than {rows} rows to price the rows past them")
    x = np.array([s.decode_rows - rows for s in past], dtype=float)
    y = np.array([s.seconds - fit.step_time(s.context_tokens, 0, s.decode_rows) for s in past])
    return fitted | {"rows_profiled": rows, "beyond_s_per_row": float(x @ y / (x @ x))}


def idle_reading(profile: dict) -> dict:
    """A saved profile (its JSON) with its front end as profiles charged it before the arrival
    probe priced it: the idle reading, all of it on the engine, and what the reading beside a
    stream holds beyond it as a delay; no price per prompt token or per running row, which only
    the probe sets. For judging a validation on both (benchmarks/corrections.py DIR@TWIN)."""
    front, beyond = front_end_parts(profile["frontend_idle_s"], profile.get("frontend_beside_s"))
    return profile | {"frontend_on_engine": True, "frontend_s": front, "frontend_s_per_token": 0.0,
                      "admit_s_per_row": 0.0, "first_token_s": beyond}


def _before_scheduler(profile: dict) -> float:
    """What a saved profile read before the scheduler: its front end and the delay beyond it."""
    return sum(front_end_parts(profile["frontend_idle_s"], profile.get("frontend_beside_s")))


def _hand_over_record(profile: dict) -> dict:
    """A saved profile's hand-over record, or one line saying it has none."""
    if not profile.get("hand_over"):
        raise ConfigError("the profile has no hand-over reading (hand_over): a profile of a server that publishes "
                          "its engine steps on /metrics records one")
    return profile["hand_over"]


def as_priced(profile: dict) -> dict:
    """A saved profile (its JSON) with its front end's engine time as priced before the hand-over
    moved it (the arrival probe's, or the idle reading), what the profile read before the
    scheduler beyond that a delay off the engine, as before: the twin without the hand-over."""
    priced = _hand_over_record(profile)["priced_s"]
    return profile | {"frontend_s": priced, "first_token_s": max(0.0, _before_scheduler(profile) - priced)}


def engine_time_at(profile: dict, engine_s: float) -> dict:
    """A saved profile (its JSON) whose front end takes `engine_s` of the engine per request (no
    price per prompt token or running row), what the profile read before the scheduler beyond that
    a delay off the engine."""
    cost = handover.engine_time(replace(StepCost.from_record(profile), frontend_s_per_token=0.0, admit_s_per_row=0.0),
                                engine_s, _before_scheduler(profile))
    return profile | asdict(cost)


def handed_over_from(profile: dict, engine_s: float, twin: RunConfig) -> dict:
    """engine_time_at's profile with the hand-over fitted from there: of the engine times that
    split the profile's hand-over burst nearest the server's rounds, the one nearest `engine_s`
    (the probe's reading alone, from a start that ignores the arrival probe)."""
    _hand_over_record(profile)
    server, probe = handover.from_record(profile)
    start = engine_time_at(profile, engine_s)
    cost, record = handed_over(StepCost.from_record(start), server, replace(probe, fit=True), twin,
                               _before_scheduler(profile), profile["frontend_idle_s"])
    return start | asdict(cost) | {"hand_over": record}


def on_engine(found: dict[str, Limit]) -> bool:
    """Whether the server's front end shares the processor its model runs on: a server that says
    it computes on the CPU. Tokenizing and HTTP then take the engine's own cores (on one pinned
    core, 10 ms of front end per request at 20 req/s is a fifth of the engine's time), so the
    twin's front end takes requests one at a time and the engine pays for it (run/driver.py
    Inbox); a server that names no device is taken to compute on an accelerator, where the
    front end only delays the request."""
    device = found.get("device")
    return device is not None and str(device.value).lower() == "cpu"


def twin_tree(cfg: RunConfig, profile_path: Path, found: dict[str, Limit]) -> dict[str, Any]:
    section = {k: v.value for k, v in found.items() if k in ContinuousConfig.model_fields}
    return {"name": f"twin-{Path(str(cfg.backend.model)).name}", "backend": {"kind": "sim", "profile": str(profile_path.resolve())},
            "strategies": [ContinuousScheduler.name], ContinuousScheduler.name: section,
            "traffic": json.loads(cfg.traffic.model_dump_json(exclude_none=True)),
            "slo": cfg.slo.model_dump(exclude_none=True), "out": f"results/twin-{Path(str(cfg.backend.model)).name}"}


def _header(cfg: RunConfig, found: dict[str, Limit]) -> str:
    lines = [f"# The twin of {cfg.backend.model} at {cfg.backend.base_url}: the simulator, with the step-time model",
             "# fitted from its streams (backend.profile), under continuous batching with its limits:"]
    lines += [f"#   continuous.{k}: {v.value!r} ({v.source})" for k, v in found.items() if k in ContinuousConfig.model_fields]
    if any(v.source.startswith("vLLM default") for v in found.values()):
        lines.append("# A 'vLLM default' is assumed, not read: edit it if the server was started otherwise.")
    if on_engine(found):
        lines.append(f"# Its front end shares the processor the model runs on (device {found['device'].value}, "
                     f"{found['device'].source}): requests pass it one at a time, taking the engine's time.")
    else:
        lines.append("# Its front end runs beside the engine (no device stated: taken as an accelerator): "
                     "it delays each request.")
    return "\n".join(lines) + "\n"


def started_record(base_url: str) -> dict[str, Any] | None:
    """What batchlab recorded when it started the server at `base_url` (`batchlab vllm up`): its
    kind and the flags it runs with; None if batchlab did not start it."""
    from batchlab.backends.tiny import data_dir
    for path in sorted((data_dir() / "servers").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and str(record.get("url", "")).rstrip("/") == base_url.rstrip("/"):
            return record
    return None

