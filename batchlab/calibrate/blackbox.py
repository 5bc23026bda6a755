"""Profile a server from the client, as a black box: its step times and its front end.

Three probes, each a short trace sent through the load target (the client every run uses):
- decode: a burst of b requests (prompt p, n tokens each, exact lengths); while all b decode
  together, the gaps between one stream's chunks are the server's decode steps at batch b;
- prefill: a request sent beside b streams decoding together (b over `streams`, and the most
  streams from the longest context too; two requests beside one stream); the streams' gap that
  ends with its first token is one step holding that prompt and b decode rows. Prompts beside
  one stream alone could not tell whether a prompt costs more beside many rows or a long
  context (cost.py's prompt-token x decode-row term is fitted from these);
- crowd (`crowds`, none by default): k short prompts sent at once beside one stream. They reach
  the scheduler over a few steps (the front end takes them one at a time), so the step that ends
  with the earliest first tokens holds however many came in together: one sample per count seen.
  One or two admissions a step cannot tell a price per admitted request from the setup of a
  prompt pass; a step admitting many can (cost.py `admit_s` against `prefill_step_s`);
- idle: one request to an idle server; its time to first token less the fitted prefill step is
  the front end (HTTP, tokenizing, streaming: what happens before the engine has the request).
  The prefill probes measure it a second way, without the fit: a prompt that came in step j of
  the stream reached the scheduler after step j-2 began and before step j did, so the midpoint
  of the stream's chunks j-2 and j-1 less its send time is its time before the scheduler plus
  the chunks' way back, within half a step (the send is moved by up to one step from probe to
  probe so those halves average out). The twin charges what it holds beyond the idle reading as
  a delay off the engine (calibrate/twin.py front_end_parts).
Probes go round the grid `repeats` times after `warmup` passes, and step medians are fitted with
calibrate/fit.py, so a twin charges its steps as the simulator charges any engine. A reference
burst (the median of three) opens and closes every pass: a server whose steps changed speed meanwhile (a restart,
other work on the machine) is refused, as is a stream that cannot give step times.
"""
from __future__ import annotations

import random
import secrets
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchlab.backends.base import LoadTarget
from batchlab.backends.cost import COEFFS, StepCost, attention_pairs
from batchlab.calibrate.fit import Fit, StepSample, fit_step_times
from batchlab.core.clock import Clock
from batchlab.core.request import Request
from batchlab.core.trace_item import TraceItem
from batchlab.errors import ConfigError

REFERENCE = (4, 32, 16)          # the reference burst: rows, prompt tokens, new tokens
REFERENCE_REPEATS = 3            # bursts per check (their median)
MAX_DRIFT = 0.30                 # a reference step slower or faster than this between passes: refused
WINDOW = 4                       # steps per measured decode window (see decode_gaps)


@dataclass(frozen=True)
class ProbeGrid:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (32, 128, 256)    # decode: prompt lengths the bursts decode from
    prompts: tuple[int, ...] = (16, 64, 256, 512)  # prefill: prompts sent beside a stream, and alone
    new_tokens: int = 24                         # tokens per decode burst
    repeats: int = 3                             # measured passes over the grid (medians)
    warmup: int = 1                              # unmeasured passes first
    gap_s: float = 0.2                           # idle time before each probe
    streams: tuple[int, ...] = (1, 4, 16)        # prefill: decoding streams a prompt is sent beside
    crowds: tuple[int, ...] = ()                 # crowd: prompts sent at once beside one stream
    crowd_tokens: int = 1024                     # crowd: prompt tokens one crowd sends at most (under a step's budget)
    terms: tuple[str, ...] = ()                  # fit: opt-in step-time terms it may use (cost.OPT_IN_TERMS)

    def crowd_sizes(self, p: int) -> list[int]:
        """The crowds sent with p-token prompts: those whose prompts fit `crowd_tokens`."""
        return [k for k in self.crowds if k * p <= self.crowd_tokens]


@dataclass
class BlackBoxProfile:
    samples: list[StepSample]
    fit: Fit
    frontend_s: float            # median of (idle TTFT - fitted prefill step)
    frontend_spread: float       # relative spread of those, for the record
    reference_s: list[float]     # the reference burst's median decode gap at each check
    reference_burst_s: float | None = None   # validation's drift probe, timed on the server right after the probes
    frontend_beside_s: float | None = None   # median time before the scheduler of prompts sent beside a stream
    arrivals: dict[tuple[int, int], list[float]] | None = None   # (streams, prompt) -> an arrival's cost, per round
    hand_over: list[dict[str, float]] | None = None   # each round's engine steps by bucket (calibrate/handover.py)
    read_whole: list[tuple[int, int, int]] | None = None   # (rows, prompt, passes) of decode bursts read whole
    unread: list[tuple[int, int, int]] | None = None       # (rows, prompt, passes) of decode bursts that gave no step


class Prober:
    """Sends probes to a load target and turns their chunk stamps into step samples."""

    def __init__(self, target: LoadTarget, clock: Clock, grid: ProbeGrid, progress: Callable[[str], None] | None):
        self.target, self.clock, self.grid, self.say = target, clock, grid, progress or (lambda m: None)
        self.tag = 0
        self.nonce = secrets.randbits(48)    # this profile's prompts: a prefix cache has seen none of them
        self.decode: dict[tuple[int, int, int], list[float]] = defaultdict(list)
        # (streams, prompts, prompt tokens, streams' prompt) -> (context, gap) of each pass
        self.mixed: dict[tuple[int, int, int, int], list[tuple[int, float]]] = defaultdict(list)
        self.crowd: dict[tuple[int, int, int, int], list[tuple[int, float]]] = defaultdict(list)   # keyed as mixed
        self.pace: dict[tuple[int, int], float] = {}   # (streams, their prompt) -> this pass's decode step
        self.start: dict[tuple[int, int], float] = {}  # (streams, their prompt) -> this pass's last first token
        self.idle: dict[int, list[float]] = defaultdict(list)                     # prompt -> TTFT
        self.beside: list[float] = []      # a prompt beside a stream: its time before the scheduler (midpoint)
        self.phase = random.Random(self.nonce)     # moves each prefill probe's send by up to one step
        self.reference: list[float] = []
        self.ref_ttft = self.ref_gap = 0.0
        self.behind: dict[tuple[int, int], int] = defaultdict(int)   # (rows, prompt) -> passes read whole (whole_streams)
        self.unread: dict[tuple[int, int], int] = defaultdict(int)   # (rows, prompt) -> passes that gave no decode step

    async def send(self, items: list[tuple[float, int, int]], behind: bool = False) -> list[tuple[Request, list[float]]]:
        """One probe: (arrival s, prompt, new tokens) each, with prompts no earlier probe used (a
        prefix cache must not shorten them); its requests and their chunk stamps, checked.
        `behind`: streams that lack chunks are kept as they came (a decode burst reads them whole)."""
        self.tag += 1
        await self.clock.sleep(self.grid.gap_s)
        trace = [TraceItem(at, p, n, content=((("probe", self.nonce, self.tag, i), p),)) for i, (at, p, n) in enumerate(items)]
        reqs, _ = await self.target.run_trace(trace, self.clock)
        return [(r, stream_checked(r, self.target.chunk_stamps(r), behind)) for r in reqs]

    async def check_reference(self, measured: bool) -> None:
        """The reference burst, REFERENCE_REPEATS times: its median decode gap and first-token time.
        NOTE: several bursts, because one on a shared machine can catch another job's moment and
        read tens of percent off; a server whose speed really changed is off in all of them."""
        rows, p, n = REFERENCE
        gaps, ttfts = [], []
        for _ in range(REFERENCE_REPEATS):
            got = await self.send([(0.0, p, n)] * rows)
            gaps.append(statistics.median(g for _, g in decode_gaps([s for _, s in got], p)))
            ttfts.append(statistics.median(s[0] - r.arrival_time for r, s in got))
        self.ref_gap, self.ref_ttft = statistics.median(gaps), statistics.median(ttfts)
        if measured:
            self.reference.append(self.ref_gap)
            first = self.reference[0]
            if first > 0 and abs(self.ref_gap / first - 1) > MAX_DRIFT:
                raise ConfigError(f"the server's decode step changed from {1e3 * first:.2f} ms to "
                                  f"{1e3 * self.ref_gap:.2f} ms during the profile (a restart, or other work on the "
                                  "machine): nothing was written; profile it again on a quiet machine")

    async def decode_pass(self, keep: bool) -> None:
        g = self.grid
        for b in g.batch_sizes:
            for p in g.contexts:
                got = await self.send([(0.0, p, g.new_tokens)] * b, behind=True)
                streams = [s for _, s in got]
                if all(len(s) == g.new_tokens for s in streams):
                    gaps = decode_gaps(streams, p)
                else:                # the front end fell behind the engine: chunk gaps are not steps here
                    gaps = whole_streams(streams, g.new_tokens)
                    self.behind[(b, p)] += keep
                self.unread[(b, p)] += keep and not gaps
                self.start[(b, p)] = max(s[0] - r.arrival_time for r, s in got)
                if gaps:
                    self.pace[(b, p)] = statistics.median(gap for _, gap in gaps)
                if keep:
                    for k, gap in gaps:
                        self.decode[(b, p, k)].append(gap)

    def beside_shapes(self) -> list[tuple[int, int, int]]:
        """(decoding streams, prompts sent together, the streams' prompt) of each prefill probe: one
        prompt beside each stream count, two beside the fewest streams (what a second admission
        adds), and one beside the most streams decoding from the longest context (what the rows'
        context adds to a step holding a prompt)."""
        g = self.grid
        shapes = [(b, 1, min(g.contexts)) for b in g.streams] + [(min(g.streams), 2, min(g.contexts))]
        return shapes + ([(max(g.streams), 1, max(g.contexts))] if len(g.contexts) > 1 else [])

    async def prefill_pass(self, keep: bool) -> None:
        g = self.grid
        for p in g.prompts:
            for streams, rows, context in self.beside_shapes():
                await self.beside_probe(streams, rows, p, context, keep)
            for k in g.crowd_sizes(p):
                await self.beside_probe(1, k, p, min(g.contexts), keep, crowd=True)
            got = await self.send([(0.0, p, 2)])
            if keep:
                r, s = got[0]
                self.idle[p].append(s[0] - r.arrival_time)

    async def beside_probe(self, streams: int, rows: int, p: int, base: int, keep: bool, crowd: bool = False) -> None:
        """`rows` prompts of p tokens sent once `streams` streams from `base`-token prompts have
        decoded a dozen steps together. A crowd's sample is the step holding its earliest first
        tokens, keyed by how many came in it; other probes' prompts must all come in one step."""
        # NOTE: the decode pass before measured this shape; the streams' own prompts can take
        # several steps (sixteen of 256 tokens are two steps of vLLM's 2048-token budget)
        pace = self.pace.get((streams, base), self.ref_gap)
        started = max(self.ref_ttft, self.start.get((streams, base), 0.0))
        at = 1.5 * started + (12 + self.phase.random()) * pace   # a dozen steps decoded by then
        steps = int((at + 3 * started) / max(pace, 1e-4)) + 24
        got = await self.send([(0.0, base, min(steps, 1024))] * streams + [(at, p, 2)] * rows)
        first = first_admissions([s for _, s in got], pace, streams)
        if not keep or first is None or (not crowd and first[1] < rows):
            return
        j, came, gap = first
        (self.crowd if crowd else self.mixed)[(streams, came, p, base)].append((streams * (base + j), gap))
        if not crowd:
            self.beside += [before_scheduler(got[0][1], j, r.arrival_time) for r, _ in got[streams:]]


async def measure(target: LoadTarget, clock: Clock, grid: ProbeGrid, progress=None) -> Prober:
    """Warm-up passes, then `repeats` measured passes over the grid, a reference burst around each."""
    pr = Prober(target, clock, grid, progress)
    await target.start(clock)
    for rep in range(grid.warmup + grid.repeats):
        keep = rep >= grid.warmup
        pr.say(f"pass {rep + 1} of {grid.warmup + grid.repeats}" + ("" if keep else " (warm-up)"))
        await pr.check_reference(keep)
        await pr.decode_pass(keep)
        await pr.prefill_pass(keep)
    await pr.check_reference(True)
    return pr


def most_samples(grid: ProbeGrid) -> int:
    """Step samples the grid can give at most: one per decode window of each (batch, context), as
    decode_gaps cuts a stream of `new_tokens` chunks, and one per prompt and prefill probe shape."""
    crowds = sum(sum(grid.crowd_sizes(p)) for p in grid.prompts)      # a sample per count at most
    return (len(grid.batch_sizes) * len(grid.contexts) * len(range(0, grid.new_tokens - WINDOW, WINDOW))
            + (len(grid.streams) + 1 + (len(grid.contexts) > 1)) * len(grid.prompts) + crowds)


def fit_profile(pr: Prober) -> BlackBoxProfile:
    """The step-time fit of the probes' medians, and the front end from the idle probes."""
    samples = [StepSample(b * (p + k), 0, b, statistics.median(v), "decode") for (b, p, k), v in sorted(pr.decode.items())]
    # NOTE: one sample per probe shape, the median over the passes: the streams' context at the
    # probe moves by a few tokens from pass to pass, and a sample per context was one unrepeated
    # timing, so a single slow step (other work on the machine) set the prompt terms
    samples += [StepSample(statistics.median(c for c, _ in v) + rows * p, rows * p, b, statistics.median(g for _, g in v),
                           kind, attn_pairs=rows * attention_pairs(p, 0), admitted=rows)
                for kind, probes in (("prefill", pr.mixed), ("crowd", pr.crowd))
                for (b, rows, p, _), v in sorted(probes.items())]
    if not any(s.kind != "decode" for s in samples):
        raise ConfigError("no prefill step could be told apart in the stream beside it (every probe's first token came "
                          "in another step than the stream's): the server may batch prompts on their own; nothing was written")
    if len(samples) < len(COEFFS):         # prefill probes the stream could not tell apart give no sample
        raise ConfigError(f"the probes gave {len(samples)} step samples and the step-time model has {len(COEFFS)} terms: "
                          "add batch sizes, contexts or prompts, or raise --new-tokens; nothing was written")
    fit = fit_step_times(samples, with_terms=pr.grid.terms)
    cost = fit.to_cost(StepCost(0, 0, 0, 0, 0, kv_bytes_per_token=1, kv_budget_bytes=1))
    front = [t - cost.step_time(p, p, 0, attention_pairs(p, 0), 1) for p, ts in pr.idle.items() for t in ts]
    med = statistics.median(front)
    spread = float(np.std(front) / abs(med)) if len(front) > 1 and med else 0.0
    return BlackBoxProfile(samples, fit, max(0.0, med), spread, pr.reference,
                           frontend_beside_s=statistics.median(pr.beside) if pr.beside else None,
                           read_whole=counted(pr.behind), unread=counted(pr.unread))


def counted(passes: dict[tuple[int, int], int]) -> list[tuple[int, int, int]] | None:
    """(rows, prompt, passes) of the decode shapes counted at least once; None for none."""
    return [(b, p, n) for (b, p), n in sorted(passes.items()) if n] or None


MERGED_AT_MOST = 0.02      # chunks a probe may lack (at least one): a server that fell behind once, not one that merges


def stream_checked(r: Request, stamps: list[float], behind: bool = False) -> list[float]:
    """The chunk stamps of a probe request, or one line saying why they cannot give step times.
    NOTE: a server streaming one token per chunk still sends two in one now and then when its
    front end falls behind the engine (vLLM on a busy core did, once in 60); up to MERGED_AT_MOST
    of the chunks may be missing, the last stamp repeated for them. That shifts the token index of
    the stamps after the merge by one, so one decode window reads one step long; the fit's median
    over the windows does not move for it. More missing is a server that merges: refused, unless
    `behind` (a decode burst, read from whole streams: whole_streams), where the stamps are kept
    as they came; the reference burst that opens every pass still refuses a server that merges."""
    if r.error:
        raise ConfigError(refusal(r.error))
    if 0 < r.output_len - len(stamps) <= max(1, int(MERGED_AT_MOST * r.output_len)) and stamps:
        return stamps + stamps[-1:] * (r.output_len - len(stamps))
    if behind and 1 < len(stamps) < r.output_len:
        return stamps
    if len(stamps) < r.output_len:
        raise ConfigError(f"the server merges tokens into chunks ({r.output_len} tokens came in {len(stamps)} "
                          "chunks): chunk gaps are not step times; run it with one token per chunk (vLLM: "
                          "--stream-interval 1); nothing was written")
    return stamps[:r.output_len]


def refusal(error: str) -> str:
    """A failed probe as the one line a user can act on."""
    if "usage report" in error:
        why = "the server streams without usage counts (stream_options.include_usage), so token counts are unknown"
    elif "HTTP 429" in error:
        why = "the server rate-limits the probes (HTTP 429): raise its limit for the profile"
    elif "ignore_eos" in error or "min_tokens" in error or "HTTP 422" in error:
        why = ("the server refuses the exact-length options (set backend.length_control: generation_config for "
               f"transformers serve): {error}")
    elif "produced" in error or "tokens" in error:
        why = f"the server does not generate exactly the tokens asked for (end-of-sequence not ignored): {error}"
    else:
        why = f"a probe failed: {error}"
    return f"profile: {why}; nothing was written"


def decode_gaps(streams: list[list[float]], prompt: int, window: int = WINDOW) -> list[tuple[int, float]]:
    """(token index k, mean step before it) over windows of `window` steps of every stream, while
    all streams decode together: after the last one's first token and up to the first one's last.
    NOTE: a window, not a single gap: when the server or the client falls behind, chunks arrive in
    bursts (a long gap, then gaps near zero), but the time across several chunks stays the steps' sum."""
    together, first_done = max(s[0] for s in streams), min(s[-1] for s in streams)
    return [(k + window // 2, (s[k + window] - s[k]) / window) for s in streams for k in range(0, len(s) - window, window)
            if s[k] >= together and s[k + window] <= first_done]


def whole_streams(streams: list[list[float]], new_tokens: int) -> list[tuple[int, float]]:
    """(middle token index, mean step) of every stream of a decode burst whose front end fell behind
    (chunks carrying several tokens, so chunk gaps are not steps): a stream's first chunk ends the
    step that computed its prompt and its last chunk carries its last token, so the time between
    them is `new_tokens` - 1 decode steps whatever merged in between. Only where the streams
    decoded together the whole way: every first chunk, and every last chunk, within half a step of
    the others (else some of those steps held fewer rows: no sample).
    NOTE: the front end that fell behind may still be behind at the last chunk, so a step reads up
    to that lag / (new_tokens - 1) long; at one token a chunk the windows of decode_gaps stay."""
    steps = [(s[-1] - s[0]) / (new_tokens - 1) for s in streams]
    half = 0.5 * statistics.median(steps)
    firsts, lasts = [s[0] for s in streams], [s[-1] for s in streams]
    if max(firsts) - min(firsts) > half or max(lasts) - min(lasts) > half:
        return []
    return [(new_tokens // 2, step) for step in steps]


def before_scheduler(stream: list[float], j: int, sent: float) -> float:
    """A request sent at `sent` whose first token came with the stream's chunk j reached the
    scheduler after step j-2 began and before step j did (else it would have been in another
    step): the midpoint of chunks j-2 and j-1 less its send time is its time before the
    scheduler plus the chunks' way back to the client, within half a step either way."""
    return (stream[j - 2] + stream[j - 1]) / 2 - sent


def mixed_step(streams: list[list[float]], gap: float, background: int = 1) -> tuple[int, float] | None:
    """The background streams' (token index, duration) of the step that ended with the new
    prompts' first tokens, if they all came in one step with it (None: they did not)."""
    first = first_admissions(streams, gap, background)
    return (first[0], first[2]) if first is not None and first[1] == len(streams) - background else None


def first_admissions(streams: list[list[float]], gap: float, background: int = 1) -> tuple[int, int, float] | None:
    """The background streams' token index and duration of the step that ended with the earliest
    of the new prompts' first tokens, and how many first tokens came with it (None: no step
    could be read); the first `background` streams decode together, the rest are the prompts.
    The duration is the first stream's time over the three steps to it, less two decode steps at
    its own pace before the probes (robust to a burst of late chunks, as decode_gaps is)."""
    bg, firsts = streams[0], [s[0] for s in streams[background:]]
    j = int(np.argmin([abs(t - min(firsts)) for t in bg]))
    if j < 3 + WINDOW or abs(bg[j] - min(firsts)) > 0.5 * gap:
        return None
    pace = (bg[j - 3] - bg[j - 3 - WINDOW]) / WINDOW
    step = bg[j] - bg[j - 3] - 2 * pace
    return (j, sum(abs(bg[j] - f) <= 0.5 * gap for f in firsts), step) if step > 0 else None
