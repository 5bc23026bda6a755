"""What a twin predicts that a live server can be measured against, judged as the server is.

- The sustained rate: the search a live server gets (core/search.py from the same bracket, to the
  same tolerance), each point the same seeded trace a client would send, run on the twin in
  virtual time and judged by the same verdict (core/sustain.py `judge`).
- A saturated burst: n requests at once, its steady-middle throughput and median TPOT, with any of
  the twin's limits changed (a what-if: the server at another sequence cap, say).
- The twin at the machine's speed now: its step costs scaled until its burst matches one measured
  on the server (`scaled_to_burst`).
- What one request costs the others: running streams' time with short requests arriving among
  them against alone (`arrival_cost`), and the step after another stream finishes against the
  step after that (`finish_cost`): the twin's request-level terms, checked directly; and how a
  step grows with its rows' context over the streams' decode alone (`context_growth`).
- Where a run stood still: the gaps between any two tokens of a run longer than a few steps while
  a stream was mid-decode (`stalled`), and a point's figures with them (`point_figures`), so two
  workloads alternated on one server can be told apart from the server changing under them.
Both run in milliseconds, so a campaign asks them before it spends minutes measuring.
"""
from __future__ import annotations

import math
import secrets
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from batchlab.backends.cost import StepCost
from batchlab.backends.simulated import SimulatedBackend
from batchlab.calibrate.validate import sim_cost
from batchlab.core.clock import Clock
from batchlab.core.config import RunConfig, SLOConfig, TrafficConfig
from batchlab.core.metrics import summarize
from batchlab.core.request import Request, Status
from batchlab.core.search import knee, significant
from batchlab.core.sustain import burst_figures, judge, makespan_rate
from batchlab.core.trace_item import TraceItem
from batchlab.core.traffic import build_trace, fixed_burst
from batchlab.core.work import Step
from batchlab.run.point import run_point


@dataclass(frozen=True)
class Twin:
    """A twin config (as `batchlab profile` writes it) ready to replay traces; `scale` multiplies
    every step cost (a machine measured slower than at the profile: validate's drift factor)."""
    cfg: RunConfig
    scale: float = 1.0
    cost: StepCost | None = None          # the step costs, where not the config's profile (one being fitted)

    def with_limits(self, **limits: Any) -> Twin:
        """The same twin with continuous-section limits replaced (e.g. max_num_seqs=8)."""
        section = self.cfg.continuous.model_copy(update=limits)
        return replace(self, cfg=self.cfg.model_copy(update={"continuous": section}))

    def replay(self, trace: list[TraceItem], traffic: TrafficConfig | None = None, slo: SLOConfig | None = None,
               rate: float = 1.0, backend: SimulatedBackend | None = None) -> list[Request]:
        """The trace on the twin, in virtual time: its requests, times from the run's start; on
        `backend` where given (a fresh `simulator()`, to read its step count after)."""
        cfg = self.cfg.model_copy(update={"traffic": traffic or self.cfg.traffic, "slo": slo or self.cfg.slo})
        return run_point(cfg, cfg.strategies[0], rate, 0, backend or self.simulator(), trace).requests

    def simulator(self) -> SimulatedBackend:
        """The simulated backend the twin's replays run on: its step costs, scaled."""
        return SimulatedBackend(sim_cost(self.cfg, self.cost or self.cfg.backend.cost(), self.scale))


class CountingSimulator(SimulatedBackend):
    """The twin's simulator, one step at a time, counting its steps by the tokens each computed as
    vLLM's `vllm:iteration_tokens_total` counts them: the prompt tokens computed plus one for every
    row that got a token (a decode row, or a prompt completed in the step). Results are the same
    as the simulator's with its decode windows (the windows only batch identical steps)."""

    def __init__(self, cost: StepCost):
        super().__init__(cost, decode_windows=False)
        self.sizes: Counter[int] = Counter()

    async def step(self, step: Step, clock: Clock) -> int:
        size = 0
        for r, n in step.chunks:
            total = r.prompt_len + len(r.token_times)
            decoding = n == 1 and r.num_computed_tokens + 1 == total and total > r.prompt_len
            size += n + (not decoding and r.num_computed_tokens + n >= total)
        self.sizes[size] += 1
        return await super().step(step, clock)


def predicted_knee(twin: Twin, traffic: TrafficConfig, slo: SLOConfig, bracket: tuple[float, float],
                   tolerance: float, max_points: int) -> dict[str, Any]:
    """The highest rate the twin sustains, searched and judged as a live server's is (the fields
    of a live search's record: sustained_rate, failed_rate, probes, settled, points)."""
    lo, hi = traffic.warmup_s, traffic.warmup_s + traffic.duration_s
    points: list[dict[str, Any]] = []

    def holds(rate: float) -> bool:
        reqs = twin.replay(build_trace(traffic, rate), traffic, slo, rate)
        v = judge(reqs, lo, hi, slo).record()
        s = summarize([r for r in reqs if r.arrival_time >= lo], slo)
        points.append({"rate": rate, "ttft_p99": s["ttft_p99"], "tpot_p99": s["tpot_p99"], **v})
        return v["sustained"]

    b = knee(holds, *bracket, tolerance=tolerance, max_probes=max_points, snap=significant(3))
    return {"sustained_rate": b.lo, "failed_rate": b.hi, "probes": [r for r, _ in b.probes], "settled": b.settled,
            "points": points}


def predicted_burst(twin: Twin, n: int, prompt_len: int, output_len: int, **limits: Any) -> dict[str, float]:
    """The burst on the twin, with `limits` replacing its own (the what-if), and the engine steps
    it took (`steps`; `step_sizes`: how many computed each number of tokens, as vLLM counts them)."""
    twin = twin.with_limits(**limits) if limits else twin
    backend = CountingSimulator(twin.simulator().cost)
    return burst_figures(twin.replay(fixed_burst(n, prompt_len, output_len), backend=backend)) | {
        "steps": backend.steps, "step_sizes": {str(k): v for k, v in sorted(backend.sizes.items())}}


def whole_burst(requests: list[Request], output: int) -> dict[str, float]:
    """A burst's figures (core/sustain.py burst_figures) less its steady-middle rates, which a burst
    run at once has none of, and its output tok/s from the first arrival to the last token
    (`span_tok_s`: every request asks for `output` tokens); with where its time went:
    `ttft_max`, when the last of them got its first token (every request taken in by then), and
    `rows_mean`, how many decoded at once on average over the span (each request's time from its
    first token to its last, summed, over the span). A burst's output rate is about `rows_mean`
    over the mean gap between two tokens, so two runs of a burst that differ in rate differ in
    how many ran at once, in what a step of them took, or both."""
    figures = {k: v for k, v in burst_figures(requests).items() if k not in ("tok_s", "req_s")}
    done = [r for r in requests if r.status is Status.FINISHED and r.token_times]
    firsts = [r.token_times[0] for r in done]
    taken_in, end = max(firsts, default=math.nan), max((r.token_times[-1] for r in done), default=math.nan)
    span = end - min(r.arrival_time for r in requests)
    intake, after = phase(done, min(firsts, default=math.nan), taken_in), phase(done, taken_in, end)
    return figures | {"span_tok_s": makespan_rate(requests) * output,
                      "ttft_max": max((r.token_times[0] - r.arrival_time for r in done), default=math.nan),
                      "rows_mean": sum(r.token_times[-1] - r.token_times[0] for r in done) / span if span > 0 else math.nan,
                      "intake_rows": intake[0], "intake_gap": intake[1], "after_rows": after[0], "after_gap": after[1]}


def phase(done: list[Request], lo: float, hi: float) -> tuple[float, float]:
    """Between `lo` and `hi`: how many requests decoded at once on average, and their mean gap
    between two tokens (the time they spent decoding there over the tokens they got there after
    their first); NaN where nothing decoded. A burst's intake runs from its first first token to
    its last (steps there may compute prompts beside the running rows), what follows only decodes.
    NOTE: means, not medians: where chunks carry several tokens the stamps inside a chunk are spread
    evenly (openai_client.token_stamps), which moves single gaps but not their sum."""
    row_s = sum(max(0.0, min(r.token_times[-1], hi) - max(r.token_times[0], lo)) for r in done)
    tokens = sum(1 for r in done for t in r.token_times[1:] if lo < t <= hi)
    if not hi > lo or not tokens:
        return math.nan, math.nan
    return row_s / (hi - lo), row_s / tokens


def predicted_whole_burst(twin: Twin, n: int, prompt_len: int, output_len: int) -> dict[str, float]:
    """`n` requests sent at once on the twin, judged over the whole burst (whole_burst)."""
    return whole_burst(twin.replay(fixed_burst(n, prompt_len, output_len)), output_len)


def steps_over(sizes: dict[str, float], cap: int) -> float:
    """The steps of a burst that computed more tokens than `cap` (in a saturated burst, the steps
    that computed prompts beside the decoding rows), from `step_sizes`: a twin's exact sizes, or
    a server's histogram buckets keyed by their upper bound (exact where `cap` is a bound, as 8,
    32 and 128 are of vLLM's; otherwise the bucket holding `cap` counts whole)."""
    return sum(n for k, n in sizes.items() if float(k) > cap)


def measured_change(entry: dict, first: dict, key: str) -> tuple[float, list[float]]:
    """A what-if cap's change on the server from the first cap, for figure `key` of its bursts:
    where the cap ran beside its own control (`control`, burst by burst in pairs), the median of
    the pairs' ratios less one, with each pair's; else the ratio of the two caps' medians less one.
    NOTE: pairs because two servers measured one after another take the machine's drift between
    them for the cap's effect."""
    if "control" in entry:
        ratios = [r[key] / k[key] - 1 for r, k in zip(entry["measured"], entry["control"], strict=True)]
        return statistics.median(ratios), ratios
    return statistics.median(r[key] for r in entry["measured"]) / statistics.median(r[key] for r in first["measured"]) - 1, []


def scaled_to_burst(twin: Twin, server_tok_s: float, n: int, prompt_len: int, output_len: int) -> Twin:
    """The twin with its step costs scaled so that its burst of n requests runs at `server_tok_s`
    (measured on the server just now). NOTE: throughput is not exactly inverse to the step scale
    (a front end's fixed time, the burst's ends), so the first guess is corrected once by
    replaying the burst at it."""
    factor = twin.scale * predicted_burst(twin, n, prompt_len, output_len)["tok_s"] / server_tok_s
    first = replace(twin, scale=factor)
    return replace(twin, scale=factor * predicted_burst(first, n, prompt_len, output_len)["tok_s"] / server_tok_s)


# What one request costs the others. LONG streams decode, alone and with ARRIVALS short requests
# arriving evenly over the middle half of what their decode took alone (ARRIVAL_SPAN), so every
# arrival and its two tokens fall inside it whatever the machine's speed, and the same arrivals
# in clumps of CLUMP (as bursty traffic brings them); and LONG streams of
# outputs FINISH_BASE + 2i, so one finishes every other step.
LONG, LONG_PROMPT, LONG_OUTPUT = 16, 32, 400
ARRIVALS, SHORT, ARRIVAL_SPAN = 30, (32, 2), (0.2, 0.7)
CLUMP = 6                   # arrivals at one instant in the clumped probe (five clumps of six)
STAY = (32, 48)             # clumped arrivals that stay: 48 tokens each, decoding beside the streams
LONG_ARRIVAL = (384, 2)     # arrivals with long prompts (the held-out long-prompt workload's middle)
FINISH_BASE = 32
Run = Callable[[list[TraceItem]], list[Request]]     # a trace -> its requests, on a server or a twin


def unique(items: list[TraceItem], tag: str) -> list[TraceItem]:
    """Prompts of their own (no prefix cache can shorten one), each run afresh."""
    nonce = secrets.randbits(48)
    return [replace(t, content=(((tag, nonce, i), t.prompt_len),)) for i, t in enumerate(items)]


def _first_long(requests: list[Request], output: int = LONG_OUTPUT) -> Request:
    return min((r for r in requests if r.max_new_tokens == output), key=lambda r: r.index)


def _decode(requests: list[Request], output: int = LONG_OUTPUT) -> tuple[float, float]:
    """The first long stream's first token (seconds after it arrived) and its decode's span."""
    first = _first_long(requests, output)
    return first.token_times[0] - first.arrival_time, first.token_times[-1] - first.token_times[0]


def context_growth(requests: list[Request]) -> dict[str, float]:
    """How a step grows with the context its rows hold: a line through the first long stream's
    token gaps against their position (the first and last 10 left out), as its step at the
    decode's start and its growth over 100 tokens of every row's context, the latter also as a
    share of the former (the machine's speed cancels from it)."""
    gaps = np.diff(np.asarray(_first_long(requests).token_times))[10:-10]
    slope, start = np.polyfit(np.arange(10, 10 + len(gaps)), gaps, 1)
    return {"step_at_start_s": float(start), "growth_per_100_s": float(100 * slope),
            "growth_per_100_share": float(100 * slope / start)}


def arrival_cost(run: Run, clump: int = 1, short: tuple[int, int] = SHORT, prefix: str = "clump_") -> dict[str, float]:
    """What one arrival adds to the running streams: (their decode's span with the arrivals - alone)
    / ARRIVALS, in seconds and in steps of the decode alone (a unit the machine's speed cancels from).
    clump > 1: the same ARRIVALS come `clump` at a time (ARRIVALS / clump instants over the same
    span), keys prefixed `prefix`: what arriving together costs beyond arriving one by one; `short`
    the arrivals' prompt and output lengths (STAY: requests that decode beside the streams a while;
    LONG_ARRIVAL: long prompts), keys prefixed too where they are not SHORT."""
    extra, alone, together, solo, _ = arrival_seconds(run, clump, short)
    out = {"arrival_s": extra, "arrival_steps": extra / (alone / (LONG_OUTPUT - 1)),
           "decode_with_s": together, "decode_alone_s": alone}
    if clump > 1 or short != SHORT:
        return {f"{prefix}{k}": v for k, v in out.items()} | {f"{prefix}size": clump, f"{prefix}output": short[1],
                                                              f"{prefix}prompt": short[0]}
    return out | context_growth(solo)


def arrival_seconds(run: Run, clump: int = 1, short: tuple[int, int] = SHORT,
                    streams: tuple[int, int, int] = (LONG, LONG_PROMPT, LONG_OUTPUT)
                    ) -> tuple[float, float, float, list[Request], float]:
    """arrival_cost's measurement: (seconds one arrival added, the decode's span alone and with
    the arrivals, the requests of the run alone, and the seconds one arrival added read inside
    the run with them: `within`). `streams`: how many streams decode, from what prompt, for how
    many tokens (more than any arrival asks for)."""
    count, prompt, output = streams
    if clump < 1 or ARRIVALS % clump:
        raise ValueError(f"clump must divide {ARRIVALS} arrivals (got {clump})")
    if output <= short[1]:
        raise ValueError(f"the streams must decode longer than the arrivals ({output} tokens against {short[1]})")
    longs = [TraceItem(0.0, prompt, output) for _ in range(count)]
    solo = run(unique(longs, "alone"))
    start, alone = _decode(solo, output)
    lo, hi = (start + f * alone for f in ARRIVAL_SPAN)
    instants = ARRIVALS // clump
    shorts = [TraceItem(lo + (hi - lo) * (j // clump) / max(instants - 1, 1), *short) for j in range(ARRIVALS)]
    both = run(unique(longs + shorts, f"with-{clump}-{short[1]}"))
    _, together = _decode(both, output)
    return (together - alone) / ARRIVALS, alone, together, solo, within(both, output) / ARRIVALS


def within(requests: list[Request], output: int = LONG_OUTPUT) -> float:
    """Seconds the other requests added to the first long stream's decode, read inside one run:
    its token gaps while none of them was on the server (the first and last ten left out) fit a
    line in the token's position (a step grows with its rows' context); the gaps that ended while
    one was, or within two steps after the last was answered, less that line, summed. Two runs
    seconds apart on a shared host differ by several percent in speed, as much as thirty arrivals
    add to a decode; within one run the machine moves far less."""
    stream = _first_long(requests, output)
    stamps = np.asarray(stream.token_times)
    gaps, ends, pos = np.diff(stamps), stamps[1:], np.arange(len(stamps) - 1)
    others = [r for r in requests if r is not stream and r.max_new_tokens != output and r.token_times]
    lo, hi = min(r.arrival_time for r in others), max(r.token_times[-1] for r in others)
    hi += 2 * float(np.median(gaps))
    inside = (ends > lo) & (ends <= hi)
    quiet = ~inside & (pos >= 10) & (pos < len(gaps) - 10)
    slope, level = np.polyfit(pos[quiet], gaps[quiet], 1)
    return float((gaps[inside] - (level + slope * pos[inside])).sum())


def finish_cost(run: Run) -> dict[str, float]:
    """What a completion adds to the next step: on the longest stream, the gap right after another
    stream's last token less the gap after it (same rows, no finish just before), median over the
    finishes; in seconds and in steps (of the median of those later gaps)."""
    reqs = run(unique([TraceItem(0.0, LONG_PROMPT, FINISH_BASE + 2 * i) for i in range(LONG)], "finish"))
    longest = max(reqs, key=lambda r: r.max_new_tokens)
    t = longest.token_times
    ends = [r.max_new_tokens for r in reqs if r is not longest]
    after = [t[n] - t[n - 1] for n in ends]        # the finished stream's last token came with token n - 1
    plain = [t[n + 1] - t[n] for n in ends]
    extra = statistics.median(a - b for a, b in zip(after, plain))
    return {"finish_s": extra, "finish_steps": extra / statistics.median(plain)}


STALL_S = 0.03          # a stall: no token from any stream for this long (6-10 decode steps on these machines)


def stalled(requests: list[Request], over: float = STALL_S, window: tuple[float, float] | None = None) -> dict[str, float]:
    """How long the run stood still with work in hand: the gaps longer than `over` between
    consecutive token stamps of all requests together, during which some request had its first
    token and not yet its last (so a server idle between arrivals, or prefilling the only request,
    is not counted); their number and summed seconds, for gaps starting inside `window`."""
    done = [r for r in requests if r.token_times]
    if not done:
        return {"stalls": 0, "stalled_s": 0.0}
    stamps = np.sort(np.concatenate([r.token_times for r in done]))
    first = np.array([r.token_times[0] for r in done])
    last = np.array([r.token_times[-1] for r in done])
    lo, hi = window or (-np.inf, np.inf)
    gaps = np.diff(stamps)
    n, total = 0, 0.0
    for i in np.flatnonzero((gaps > over) & (stamps[:-1] >= lo) & (stamps[:-1] < hi)):
        t, g = stamps[i], gaps[i]
        if ((first <= t) & (last >= t + g)).any():
            n, total = n + 1, total + float(g)
    return {"stalls": n, "stalled_s": total}


def point_figures(requests: list[Request], warmup_s: float, duration_s: float) -> dict[str, float]:
    """One point's medians over the requests arriving after the warm-up, and its stalls over the
    same window (times from the run's start)."""
    counted = [r for r in requests if r.arrival_time >= warmup_s]
    s = summarize(counted)
    return {k: s[k] for k in ("tpot_p50", "ttft_p50", "e2e_p50")} | {"requests": len(counted)} | stalled(
        requests, window=(warmup_s, warmup_s + duration_s))


def alternation(points: list[dict[str, Any]], key: str = "tpot_p50") -> dict[str, Any]:
    """Points of two workloads run alternately on one server (base first in every pair), each
    with the twin's figures on the same trace: per pair, the other workload's `key` over base's on
    the server and on the twin, and per point the twin's over the server's. Medians over the pairs
    after the first, which runs on the freshest server and is reported apart: its base point over the
    next one (the nearest in time, so a machine drifting over the run moves both alike)."""
    pairs = [(points[i], points[i + 1]) for i in range(0, len(points) - 1, 2)]
    rows = [{"server": o["server"][key] / b["server"][key], "twin": o["twin"][key] / b["twin"][key],
             "twin_over_server": [b["twin"][key] / b["server"][key], o["twin"][key] / o["server"][key]]} for b, o in pairs]
    later = rows[1:] or rows
    med = lambda xs: float(statistics.median(xs)) if xs else float("nan")  # noqa: E731
    return {"metric": key, "pairs": rows,
            "server_ratio": med([r["server"] for r in later]), "twin_ratio": med([r["twin"] for r in later]),
            "base_twin_over_server": med([r["twin_over_server"][0] for r in later]),
            "other_twin_over_server": med([r["twin_over_server"][1] for r in later]),
            "first_base_over_next": pairs[0][0]["server"][key] / pairs[1][0]["server"][key] if len(pairs) > 1 else float("nan")}
