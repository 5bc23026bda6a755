"""`batchlab profile` on a server (backend.kind openai): probe it, fit it, write its twin.

The server is checked first (it answers, it serves the model); its /metrics page is read before
and after the probes, so a server that restarted meanwhile is refused; nothing is written unless
every probe gave step times and the fit succeeded (calibrate/blackbox.py, calibrate/twin.py).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from batchlab.backends import make_backend
from batchlab.backends.base import LoadTarget
from batchlab.backends.cost import StepCost
from batchlab.backends.metrics_page import engine_steps
from batchlab.calibrate.blackbox import BlackBoxProfile, ProbeGrid, fit_profile, measure, refusal
from batchlab.calibrate.front_end import ArrivalProbe, arrival_costs
from batchlab.calibrate.handover import HandOverProbe, described, handed, read_server
from batchlab.calibrate.twin import limits, started_record, write_twin
from batchlab.calibrate.twin_check import ARRIVALS, Run
from batchlab.calibrate.validate import SERVER, burst_seconds, load_profiles
from batchlab.core.clock import RealClock
from batchlab.core.config import RunConfig
from batchlab.errors import ConfigError


def profile_server(cfg: RunConfig, grid: ProbeGrid, profile_path: Path, twin_path: Path, progress=None,
                   target: LoadTarget | None = None, transport=None,
                   arrivals: ArrivalProbe | None = ArrivalProbe(),
                   hand_over: HandOverProbe | None = HandOverProbe()) -> RunConfig:
    """Profile the server `cfg` names; write its profile and twin config; return the twin.
    `target` and `transport` replace the client and its HTTP transport (tests fake a server);
    `arrivals`: the probe that prices the front end's engine time (None: the idle reading is the
    front end, on the engine only for a server that says it computes on the CPU); `hand_over`: the
    burst whose engine steps, counted by the server's /metrics, set how the twin's front end hands
    requests over (calibrate/handover.py; skipped where the server publishes no step histogram)."""
    from batchlab.backends.openai_client import api_key, check_server, server_config, server_metrics
    key = api_key(cfg.backend.api_key_env)
    for line in check_server(cfg.backend.base_url, cfg.backend.model, key, transport=transport):
        if progress:
            progress(f"warning: {line}")
    before = server_metrics(cfg.backend.base_url, key, transport)
    load_before = os.getloadavg()[0]
    target = target or make_backend(cfg)
    clock = RealClock()
    try:
        probes = clock.run(measure(target, clock, grid, progress))
        costs = None
        if arrivals:
            if progress:
                progress(f"arrivals: {ARRIVALS} among {', '.join(map(str, arrivals.streams))} streams, prompts of "
                         f"{', '.join(map(str, arrivals.prompts))} tokens, {arrivals.rounds} rounds")
            costs = arrival_costs(_run_on(target, clock), arrivals)
        steps = _hand_over(cfg, target, clock, hand_over, progress, transport) if hand_over else None
        if arrivals or hand_over:
            clock.run(probes.check_reference(True))      # a server that changed during them is refused too
        # NOTE: a validation's drift is taken against this timing, so it measures the machine, not the fit
        reference = burst_seconds(target, SERVER, cfg)
    finally:
        clock.run(target.close())
    after = server_metrics(cfg.backend.base_url, key, transport)
    started = before.get("process_start_time_seconds"), after.get("process_start_time_seconds")
    if started[0] != started[1]:
        raise ConfigError("profile: the server restarted during the profile (its process start time changed); "
                          "nothing was written")
    prof = replace(fit_profile(probes), reference_burst_s=reference, arrivals=costs, hand_over=steps)
    found = limits(cfg, after, started_record(cfg.backend.base_url), server_config(cfg.backend.base_url, key, transport))
    setup = target.describe() | {"load_avg_1min": [load_before, os.getloadavg()[0]], "cpu_count": os.cpu_count(),
                                 "server_metrics": {k: v for k, v in after.items() if k != "process_start_time_seconds"}}
    twin = write_twin(cfg, prof, grid, setup, found, profile_path, twin_path, arrivals, hand_over)
    if progress:
        _say(progress, prof, twin.backend.cost(), json.loads(profile_path.read_text()))
        progress(_reference_line(twin_path, prof))
        progress(f"wrote {profile_path} and {twin_path}: `batchlab run {twin_path}` simulates the server")
    return twin


def _say(progress: Callable[[str], None], prof: BlackBoxProfile, c: StepCost, record: dict) -> None:
    """The fit and the front end, in two lines, and a third for the hand-over where it was read."""
    f = prof.fit
    progress(f"fit ({f.num_samples} steps, rms error {100 * f.rms_rel_error:.1f}%): decode step "
             f"{1e3 * c.step_time(0, 0, 1):.2f} ms at batch 1, "
             + (f"{1e9 * c.dense_s_per_pair:.3f} ns per query x key read, " if c.dense_s_per_pair else "") + "front end "
             f"{1e3 * prof.frontend_s:.1f} ms per request idle" + ("" if prof.frontend_beside_s is None else
             f", {1e3 * prof.frontend_beside_s:.1f} ms before the scheduler beside a stream"))
    passes = record["grid"]["repeats"]
    if whole := record.get("decode_read_whole"):
        progress("decode bursts read from whole streams (the front end fell behind, chunks carried several tokens): "
                 + ", ".join(f"{b} rows from {p} tokens ({n} of {passes} passes)" for b, p, n in whole))
    if unread := record.get("decode_unread"):
        progress("decode bursts that gave no step (their streams never all decoded together: the server admitted "
                 "them over several steps): " + ", ".join(f"{b} rows from {p} tokens ({n} of {passes} passes)"
                                                        for b, p, n in unread))
    if fe := record.get("front_end_priced"):
        progress(f"front end priced by the arrivals: {1e3 * fe['engine_s']:.2f} ms + {1e6 * c.frontend_s_per_token:.1f} "
                 f"us a prompt token + {1e6 * c.admit_s_per_row:.0f} us a running row of the engine's time, then "
                 f"{1e3 * fe['delay_s']:.1f} ms off the engine")
    if ho := record.get("hand_over"):
        progress(f"hand-over: the server computed the burst's prompts in {described(ho['server'], ho['probe'])}; the "
                 f"twin at {1e3 * ho['priced_s']:.2f} ms a request of the engine in "
                 f"{described([ho['twin_priced']], ho['probe'])}; {handed(ho)} "
                 f"(then {1e3 * c.first_token_s:.1f} ms off the engine)")


def _reference_line(twin_path: Path, prof: BlackBoxProfile) -> str:
    """The drift probe's one timing here beside the fit's replay of the same burst. A validation
    divides its timings by the replay (validation.drift_against: prediction); with `profile` it
    divides by this timing instead, and a slow moment here would read as a faster machine at every
    validation after, so the line says where the two stand apart."""
    timed, twin = prof.reference_burst_s, load_profiles([], str(twin_path))[SERVER]
    predicted = twin.predicted_reference_s(SERVER)
    ratio, sigma = timed / predicted, prof.fit.rms_rel_error
    far = abs(math.log(ratio)) > 2 * sigma
    return (f"drift probe: its burst took {1e3 * timed:.0f} ms, {ratio:.2f}x the fit's replay of it (fit rms "
            f"{100 * sigma:.1f}%)" + (": more than twice the fit's error apart, so a validation's drift against this "
                                      "timing (validation.drift_against: profile) would carry it"
                                      if far else ""))


def _hand_over(cfg: RunConfig, target: LoadTarget, clock: RealClock, probe: HandOverProbe, progress,
               transport) -> list[dict[str, float]] | None:
    """The hand-over probe's rounds on the server (None where it publishes no engine-step histogram)."""
    if progress:
        progress(f"hand-over: {probe.requests} prompts of {probe.prompt} tokens at once, {probe.rounds} rounds, "
                 "engine steps from the server's /metrics")
    steps = read_server(_run_on(target, clock), lambda: engine_steps(cfg.backend.base_url, transport), probe)
    if steps is None and progress:
        progress("hand-over: the server publishes no engine-step histogram on /metrics; the front end stays as priced")
    return steps


def _run_on(target: LoadTarget, clock: RealClock) -> Run:
    """A trace sent through the client on the wall clock; a failed request is one line."""
    def run(trace):
        reqs, _ = clock.run(target.run_trace(trace, clock))
        if failed := next((r for r in reqs if r.error), None):
            raise ConfigError(refusal(failed.error))
        return reqs
    return run
