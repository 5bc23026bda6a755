"""How a server's front end hands a burst to its engine, read from the engine's own step count.

A burst of prompts sent at once to an idle server reaches the scheduler over one engine step or
several: the front end (HTTP, tokenizing, passing the request between processes) takes requests
one after another, and where it shares the engine's processor the engine computes the first
prompts while the rest are still on their way. How the first wave is split repeats in every wave
after it (the requests finish as they started, and the freed places are filled in the same
groups), so the split shapes every saturated burst: at a cap of 32, vLLM on one core computed a
wave's prompts in three steps, a twin handing its requests over at once in one, and the twin's
p50 TPOT lacked the steps its decode rows share with others' prompts.

The arrival probe (calibrate/front_end.py) prices the front end's engine time from what arrivals
cost running streams: a few milliseconds read against tens, and on one profile it read zero where
the server's waves were split in three. This probe reads the split itself: `requests` prompts of
`prompt` tokens at once to the idle server, `rounds` times, each round's engine steps counted by
the server's histogram of tokens per step (vLLM `vllm:iteration_tokens_total`, read from /metrics
before and after). A step computing a prompt computes more tokens than the burst has rows, a
decode step no more, so the buckets above `requests` count the prompt steps and roughly how many
prompts each held. The twin replays the same burst with its front end's engine time per request
at each of a grid of values, counting its steps the same way; the value found is the one whose
prompt steps are nearest the server's (fewest steps off, bucket by bucket, the median over the
rounds), the nearest the arrival probe's price among equals. Where the probe asks (`fit`, see
`applied` for why not by default) the twin takes it, what the front end holds beyond it staying a
delay off the engine; the profile records the server's split, the twin's and the value either way.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from batchlab.backends.cost import StepCost
from batchlab.backends.metrics_page import steps_between
from batchlab.calibrate.twin_check import Run, Twin, predicted_burst, unique
from batchlab.core.traffic import fixed_burst

Sizes = dict[str, float]            # a histogram bucket's upper bound (as vLLM prints it) -> steps in it
SETTLE_S = 0.3                      # after a round, before /metrics is read: the last step's count reaches it late
GRID_STEP_S = 5e-5                  # the twin's front end is tried every 0.05 ms ...
GRID_TOP_S = 5e-3                   # ... up to 5 ms a request, or twice the idle reading where more


@dataclass(frozen=True)
class HandOverProbe:
    requests: int = 32              # prompts at once: a cap of 32's first wave
    prompt: int = 64                # tokens each: 32 of them fill vLLM's 2048-token step budget exactly
    output: int = 2                 # the prompt's token and one more
    rounds: int = 3
    fit: bool = False               # take the engine time found; off: record it and the split, keep the price

    def __post_init__(self):
        if self.requests < 1 or self.rounds < 1 or self.output < 1:
            raise ValueError("a hand-over probe needs at least one request, one round and one output token")
        if self.prompt < self.requests:
            # NOTE: a prompt step computes at least prompt + 1 tokens and a decode step at most
            # `requests`; shorter prompts would share buckets with the decode steps
            raise ValueError(f"the probe's prompts ({self.prompt} tokens) must be at least as long as it has "
                             f"requests ({self.requests}), so its prompt steps can be told from decode steps")


def prompt_steps(sizes: Sizes, probe: HandOverProbe) -> Sizes:
    """The buckets of a burst's steps that computed prompts (bound above the burst's rows), and their counts."""
    return {k: v for k, v in sizes.items() if float(k) > probe.requests and v}


def bucketed(exact: dict[str, float], bounds: list[str]) -> Sizes:
    """A twin's exact step sizes in a server's histogram buckets (upper bounds, as printed)."""
    edges = sorted(bounds, key=float)
    out = dict.fromkeys(edges, 0.0)
    for size, n in exact.items():
        out[next(b for b in edges if float(size) <= float(b))] += n
    return out


def apart(twin: Sizes, server: Sizes) -> float:
    """How many prompt steps two bursts differ by, bucket by bucket."""
    return sum(abs(twin.get(k, 0.0) - server.get(k, 0.0)) for k in set(twin) | set(server))


def read_server(run: Run, read_steps: Callable[[], dict[float, float] | None], probe: HandOverProbe,
                sleep: Callable[[float], None] = time.sleep) -> list[Sizes] | None:
    """Each round's engine steps on the server, by bucket (every bucket, as published); None where
    the server publishes no step histogram."""
    rounds = []
    for _ in range(probe.rounds):
        before = read_steps()
        if before is None:
            return None
        run(unique(fixed_burst(probe.requests, probe.prompt, probe.output), "hand-over"))
        sleep(SETTLE_S)
        after = read_steps()
        if after is None:
            return None
        rounds.append(steps_between(before, after)["step_sizes"])
    return rounds


def on_twin(twin: Twin, cost: StepCost, probe: HandOverProbe, bounds: list[str]) -> Sizes:
    """The probe's burst on the twin with step costs `cost`, its steps in the server's buckets."""
    steps = predicted_burst(replace(twin, cost=cost), probe.requests, probe.prompt, probe.output)["step_sizes"]
    return bucketed(steps, bounds)


def engine_time(cost: StepCost, engine_s: float, before_s: float) -> StepCost:
    """The step model with its front end taking `engine_s` of the engine per request, and what the
    profile read before the scheduler (`before_s`) beyond that as a delay off it."""
    return replace(cost, frontend_on_engine=True, frontend_s=engine_s, first_token_s=max(0.0, before_s - engine_s))


@dataclass(frozen=True)
class HandOver:
    engine_s: float                 # the front end's engine time per request the fit found (the twin's, with `fit`)
    priced_s: float                 # what the profile priced it at before (the arrival probe, or the idle reading)
    server: list[Sizes]             # each round's engine steps on the server, by bucket (every bucket)
    twin: Sizes                     # the burst's prompt steps on the twin at engine_s
    twin_priced: Sizes              # and at priced_s
    apart: float                    # median over the rounds of the steps the twin is off at engine_s
    apart_priced: float             # and at priced_s
    probe: HandOverProbe

    def record(self) -> dict[str, Any]:
        return asdict(self)


def fit(server: list[Sizes], twin: Twin, cost: StepCost, before_s: float, probe: HandOverProbe,
        top_s: float = GRID_TOP_S) -> HandOver:
    """The front end's engine time per request whose burst on the twin computes its prompts in the
    server's steps (module doc); `cost` holds the priced front end, `before_s` the time before the
    scheduler the profile read (engine time and delay together). A front end off the engine (a
    server computing on an accelerator) hands a burst over at once whatever it costs: its split is
    recorded and nothing is fitted."""
    bounds = sorted({k for r in server for k in r}, key=float)
    wanted = [prompt_steps(r, probe) for r in server]

    def off(c: StepCost) -> tuple[float, Sizes]:
        mine = prompt_steps(on_twin(twin, c, probe, bounds), probe)
        return statistics.median(apart(mine, w) for w in wanted), mine

    priced = cost.frontend_s
    priced_off, priced_sizes = off(cost)
    best, (best_off, best_sizes) = priced, (priced_off, priced_sizes)
    if cost.frontend_on_engine:
        for f in np.arange(0.0, top_s + GRID_STEP_S / 2, GRID_STEP_S):
            got = off(engine_time(cost, float(f), before_s))
            # NOTE: the price stays unless a value splits the burst nearer the server's; among equals the nearest to it
            if (got[0], abs(f - priced)) < (best_off, abs(best - priced)):
                best, (best_off, best_sizes) = float(f), got
    return HandOver(best, priced, server, best_sizes, priced_sizes, best_off, priced_off, probe)


def applied(cost: StepCost, found: HandOver, before_s: float) -> StepCost:
    """The step model with the front end's engine time the hand-over found, where its probe asked
    for the fit (unchanged where it did not, or kept the price).
    NOTE: not by default. The split does not pin the engine time: on vLLM on one core the probe's
    burst split alike at 0.05-0.6 ms and at 2.8 ms a request, and a what-if's waves split
    differently at the two; fitted from 0 ms the twin's what-if prompt steps came to vLLM's at caps
    8 and 128 and halfway at 32, from the idle reading (2.5 ms) they did not move
    (docs/results/twin.md, "How the front end hands a burst over")."""
    if not found.probe.fit or found.engine_s == found.priced_s:
        return cost
    return engine_time(cost, found.engine_s, before_s)


def described(rounds: list[Sizes], probe: HandOverProbe | dict) -> str:
    """Prompt steps by bucket, round after round: '3 steps (≤128, ≤1024, ≤2048); 3 steps (≤128, ≤1024 ×2)'."""
    probe = probe if isinstance(probe, HandOverProbe) else HandOverProbe(**probe)
    said = []
    for r in rounds:
        kept = sorted(prompt_steps(r, probe).items(), key=lambda kv: float(kv[0]))
        n = sum(v for _, v in kept)
        said.append(f"{n:g} step{'s' * (n != 1)} (" + ", ".join(f"≤{k}" + (f" ×{v:g}" if v != 1 else "") for k, v in kept)
                    + ")")
    return "; ".join(said)


def handed(ho: dict) -> str:
    """What the hand-over fit found and whether the twin took it, from a profile's `hand_over` record."""
    if ho["engine_s"] == ho["priced_s"]:
        return "the fit keeps that price"
    found = f"{1e3 * ho['engine_s']:.2f} ms, splitting it in {described([ho['twin']], ho['probe'])}"
    return (f"the twin takes {found}" if ho["probe"].get("fit") else
            f"the fit found {found}, not taken (the twin keeps the price; --hand-over-fit takes it)")


def from_record(record: dict) -> tuple[list[Sizes], HandOverProbe] | None:
    """A saved profile's hand-over readings and probe (None where it has none)."""
    h = record.get("hand_over")
    return (h["server"], HandOverProbe(**h["probe"])) if h else None
