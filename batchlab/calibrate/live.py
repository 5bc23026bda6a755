"""The live factor: how much slower a backend's steps run under live traffic than in the closed
bursts its profile was fitted on, measured on held-out workloads without judging any of them on
itself.

A profile times bursts of identical requests arriving at once; live traffic interleaves
arrivals, mixed lengths, admissions and departures with the steps. On a shared CPU the replays
of a closed-burst profile read below the real runs in most cells, quiet or busy, and the
reference-burst drift correction (a closed burst too) does not see it. So `validate` measures it:

    x(cell)      = log(real p50 TPOT / replayed)          per real run (first and rerun), per level
    s(cell)      = log(replayed at LIVE_PROBE x / replayed) / log LIVE_PROBE
    u(cell)      = x / s                                   the log factor that puts the cell on the real run
    live(W, L)   = exp(median u over the cells of every workload but W at level L)
    se(W, L)     = 1.2533 x 1.4826 x MAD(u) / sqrt(n)      the median's standard error, relative
                   (validation.se_units workloads, the default: at least sd(each other workload's
                   median u) / sqrt(their number), see between_se)

s is how far p50 TPOT moves with the step costs: under load it is above 1 (longer steps keep
more requests running at once, which lengthens every step again), and taking x itself for the
log factor overshot (on vLLM at 0.65 of its saturated rate, a factor of 1.19 put the replays
21-62 % above the server where they had been 11-20 % below). As for the first token, a second
pass measures x and s around the first pass's factor and adds its u (one Newton step); the
median absolute deviation keeps one insensitive cell from swelling the standard error.
Workload W is then replayed with every step cost times drift x live(W, L), and the intervals
carry se beside the fit's error and the drift's spread. W's own cells never set its factor, so
every judged cell stays held out (leave one workload out). p50 TPOT is the ratio's metric
because it is step time alone (TTFT and E2E add queueing, which bends with the step cost).
The factor pooled over every workload is what a later run should use: `validate` writes each
profile again with its step costs times that factor.

The first-token factor: what is left of the first token's error once the steps run at live speed.
A server's first token can cost more (or less) under live traffic than its steps say: tokenizing,
admission, a front end sharing the processor. After the live factor, `validate` replays each real
point twice more, with the first-token terms (StepCost.FIRST_TOKEN_TERMS: the prompt's pass and
the front end) at 1x and at PROBE x, and per cell

    x = log(real p50 TTFT / replayed at 1x),  s = log(replayed at PROBE / replayed at 1x) / log PROBE
    u = x / s        the log factor on those terms that would put this cell's TTFT on the real one

(s: how much of the cell's TTFT those terms carry; cells below MIN_SHARE, where queueing behind
other requests' steps sets the TTFT, are left out). u goes through the same leave-one-out median
and standard error as the live factor's log ratios. TTFT is not linear in the log of the factor
(a fixed part stays), so a second pass measures x and s again around the first pass's factor
(the probe at that factor and PROBE x it) and adds its log: one Newton step.

The first-token delay (`validation.first_token: delay`, the default) measures the same miss as
seconds a request instead, replayed as a delay before the scheduler sees each request (StepCost
first_token_s), off the engine. Per cell, with replays at the delay so far and DELAY_PROBE_S more,

    x = real p50 TTFT - replayed,  s = (replayed at +DELAY_PROBE_S - replayed) / DELAY_PROBE_S,  u = x / s

and u goes through the same leave-one-out median, its standard error in seconds. Why a delay:
the factor multiplies the prompt-pass terms, so what is really a fixed time a request (a front
end the profile read too short) is charged per prompt token, and a workload of long prompts
pays it many times over; a delay charges every request the same. A negative delay (the other
workloads' first tokens came early on the server) is taken from the profile's front end, never
below none (StepCost.first_token_moved): a replay cannot hand a request over before it arrives.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from batchlab.backends.cost import StepCost
from batchlab.core.files import write_atomic

METRIC = "tpot_p50"
FIRST_METRIC = "ttft_p50"
PROBE = 1.5              # the first-token terms' trial factor, for each cell's sensitivity s
MIN_SHARE = 0.1          # the least d log TTFT / d log (first-token terms) a cell must have to be used
FIRST_PASSES = 2         # the second pass measures around the first's factor (TTFT is not linear in log factor)
SE_OF_MEDIAN = 1.2533141373155   # sqrt(pi / 2): the median's standard error over the mean's, for a normal
DELAY_PROBE_S = 0.010    # the first-token delay's trial step, for each cell's sensitivity s
MAD_TO_SD = 1.4826       # a normal's standard deviation over its median absolute deviation
LIVE_PROBE = 1.1         # the live factor's trial factor on every step cost, for each cell's sensitivity s
LIVE_PASSES = 2          # as for the first token: p50 TPOT is not linear in the log of the step costs
ESTIMATOR = (f"per cell u = x / s (s from a {LIVE_PROBE}x probe on every step cost), {LIVE_PASSES} passes; "
             "standard errors from the median absolute deviation")   # what accuracy.json's live section says it used


@dataclass(frozen=True)
class Live:
    factor: float = 1.0    # live step time over the profile's (> 1: live traffic runs slower)
    se: float = 0.0        # relative standard error of the factor
    cells: int = 0         # the ratios it was measured from (0: none, factor 1)


NONE = Live()


@dataclass(frozen=True)
class Delay:
    seconds: float = 0.0   # added before the scheduler sees each request (negative: taken from its front end)
    se: float = 0.0        # its standard error, in seconds
    cells: int = 0         # the cells it was measured from (0: none, no delay)


NO_DELAY = Delay()


def _median_se(values: list[float]) -> tuple[np.ndarray, float]:
    """The finite values, and their median's standard error, from their median absolute
    deviation (x MAD_TO_SD, the standard deviation it gives for a normal).
    NOTE: not from the standard deviation: one cell whose metric a probe barely moves gives a
    u far from the rest, and the median shrugs it off, but a standard deviation took it in full
    (a first-token delay of 2 ms once came with a standard error of 158 ms)."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if v.size < 2:
        return v, 0.0
    return v, SE_OF_MEDIAN * MAD_TO_SD * float(np.median(np.abs(v - np.median(v)))) / math.sqrt(v.size)


def estimate(log_ratios: list[float]) -> Live:
    """The factor from log(real / replayed) ratios: their median, and its standard error."""
    v, se = _median_se(log_ratios)
    return Live(float(math.exp(np.median(v))), se, int(v.size)) if v.size else NONE


def estimate_delay(seconds: list[float]) -> Delay:
    """The first-token delay from each cell's u (seconds): their median and its standard error."""
    v, se = _median_se(seconds)
    return Delay(float(np.median(v)), se, int(v.size)) if v.size else NO_DELAY


def distinct(x: Live | Delay, gate: float) -> bool:
    """Whether `x` lies more than `gate` of its standard errors from none (a factor of 1, judged on
    its log; a delay of 0 s). `gate` 0, or no standard error (fewer than two cells), keeps it: there
    is nothing to judge it by."""
    if gate <= 0 or x.se <= 0:
        return True
    size = abs(x.seconds) if isinstance(x, Delay) else abs(math.log(x.factor))
    return size > gate * x.se


def gated(x: Live | Delay, gate: float) -> Live | Delay:
    """`x` where it is `distinct` from none, else none with its standard error and cells kept: a
    correction the noise cannot tell from none is not applied, but the interval still carries how
    far it could be off."""
    if distinct(x, gate):
        return x
    return replace(x, seconds=0.0) if isinstance(x, Delay) else replace(x, factor=1.0)


def gated_all(per_w: dict[str, dict[str, Live]], gate: float) -> dict[str, dict[str, Live]]:
    """`gated` on every workload's and level's factor (or delay)."""
    return {w: {lvl: gated(x, gate) for lvl, x in per.items()} for w, per in per_w.items()}


def _levels(ratios: dict[str, dict[str, list[float]]]) -> list[str]:
    """Every level some workload has ratios at, sorted: the same order in every run."""
    return sorted({lvl for per in ratios.values() for lvl in per})


def between_se(groups: list[list[float]]) -> float:
    """The standard error of a correction counted over workloads, not cells: the spread of the
    workloads' own medians over the square root of their number (0 with fewer than two).
    NOTE: a workload's cells share its traffic and move together, so the cells' standard error
    says how well the workloads *measured* pin the correction down, not how well it carries to a
    workload it never read. On a busy host vLLM's `base` and `bursty` workloads ran closer to their
    profile than `long-prompts` and `long-outputs`; each workload's factor, read on the others,
    leaned to the other pair (1.16 for `base` and `bursty`, 1.05 for the long ones), passed a gate of
    2 standard errors of the cells (3.4 and 3.9 of them) and put `base` and `bursty` 13-41 % above
    the server."""
    meds = [float(np.median(v)) for g in groups if (v := [x for x in g if math.isfinite(x)])]
    return float(np.std(meds, ddof=1)) / math.sqrt(len(meds)) if len(meds) > 1 else 0.0


def _over(groups: list[list[float]], est, units: str) -> Live | Delay:
    """`est` over every value of `groups` (one list per workload); with `units` "workloads" its
    standard error is at least `between_se`."""
    x = est([v for g in groups for v in g])
    return replace(x, se=max(x.se, between_se(groups))) if units == "workloads" and x.cells else x


def leave_one_out(ratios: dict[str, dict[str, list[float]]], est=estimate,
                  units: str = "cells") -> dict[str, dict[str, Live]]:
    """workload -> level -> the factor (`est`: or the delay) measured on every *other* workload's
    values at that level (`ratios`: workload -> level -> log ratios, or seconds). A workload with
    no other at its level gets none. `units`: what its standard error counts (`between_se`)."""
    return {w: {lvl: _over([per.get(lvl, []) for o, per in ratios.items() if o != w], est, units)
                for lvl in _levels(ratios)} for w in ratios}


def pooled(ratios: dict[str, dict[str, list[float]]], est=estimate, units: str = "cells") -> dict[str, Live]:
    """level -> the factor (or delay) over every workload's values: what a later run of the profile should use."""
    return {lvl: _over([per.get(lvl, []) for per in ratios.values()], est, units) for lvl in _levels(ratios)}


def log_ratio(real: float, replayed: float) -> float:
    """log(real / replayed), NaN where either is missing or not positive (a point with no TPOT)."""
    if not (real > 0 and replayed > 0 and math.isfinite(real) and math.isfinite(replayed)):
        return float("nan")
    return math.log(real / replayed)


def log_correction(real: float, at_one: float, at_probe: float, probe: float = PROBE) -> float:
    """u = x / s for one cell (see the module's doc): NaN where a value is missing or the
    terms the probe scaled carry less than MIN_SHARE of the cell's metric: the first-token
    factor's u (p50 TTFT, probe PROBE) and the live factor's (p50 TPOT, probe LIVE_PROBE)."""
    x, dx = log_ratio(real, at_one), log_ratio(at_probe, at_one)
    if not (math.isfinite(x) and math.isfinite(dx)) or dx / math.log(probe) < MIN_SHARE:
        return float("nan")
    return x * math.log(probe) / dx


def first_token_delay(real: float, at_now: float, at_probe: float) -> float:
    """u = x / s in seconds for one cell (see the module's doc): NaN where a value is missing or a
    delay moves the cell's TTFT by less than MIN_SHARE of itself."""
    x, dx = real - at_now, at_probe - at_now
    if not (math.isfinite(x) and math.isfinite(dx)) or dx / DELAY_PROBE_S < MIN_SHARE:
        return float("nan")
    return x * DELAY_PROBE_S / dx


def write_live_profile(src: str, dst: Path, live: Live, first: Live | Delay = NONE, drift: float = 1.0) -> None:
    """The profile `src` with its step-time model scaled by the drift factor the validation's
    replays ran at (`drift`) times the live factor measured on top of it and, for a first-token
    factor, its first-token terms by it (`StepCost.scaled`), or a first-token delay set; everything
    else it holds kept and the corrections recorded, so `backend.profile: dst` simulates live traffic."""
    cost = StepCost.from_json(src)
    if isinstance(first, Delay):
        cost = cost.scaled(drift * live.factor).first_token_moved(first.seconds)
    else:
        cost = cost.scaled(drift * live.factor, first.factor)
    record = json.loads(Path(src).read_text()) | asdict(cost)
    record["live_factor"] = {"factor": live.factor, "se": live.se, "cells": live.cells, "metric": METRIC,
                             "from": str(src)}
    record["drift_factor"] = drift
    if first.cells:
        record["first_token_delay" if isinstance(first, Delay) else "first_token_factor"] = asdict(first) | {
            "metric": FIRST_METRIC}
    write_atomic(dst, json.dumps(record, indent=2) + "\n")
