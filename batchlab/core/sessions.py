"""Multi-turn sessions: a closed loop per conversation.

A session starts at an arrival of the rate's process (its first turn is an ordinary trace item).
Turn k+1 is sent think time after turn k's answer finished, with the whole conversation as its
prompt: turn k's prompt, turn k's answer, then a new message. Lengths, think times and message
content are planned with the trace (`plan_followups`), so they depend on the seed only; arrival
times and the answer's ids are known only at run time (`Conversations.next_turn`, called by the
driver on the run's clock, virtual or real: one code path).
NOTE: a backend that produces no token ids (the simulator) answers with placeholder ids derived
from (session, turn), so later prompts of a simulated run and of a real model differ in those ids
(never in their lengths). A session ends early when a turn fails, and is cut when its next turn
would arrive at or after the end of the point's traffic (so every arrival lies inside the window
the metrics and the Little's-law check use, as with every other arrival process).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from batchlab.core.config import SessionsConfig
from batchlab.core.content import segment_ids, token_ids
from batchlab.core.limits import MAX_LENGTH
from batchlab.core.request import Request, Status
from batchlab.core.trace_item import FollowUp, TraceItem


def plan_followups(cfg: SessionsConfig, n: int, rng: np.random.Generator, outputs: np.ndarray,
                   key: tuple) -> list[tuple[FollowUp, ...]]:
    """Turns 2..T of n sessions; `outputs` draws output lengths (the traffic's output_len),
    `key` (seed, repeat) makes message content unique to this trace."""
    from batchlab.core.traffic import sample_lengths  # NOTE: traffic imports this module
    k = cfg.turns - 1
    if k == 0:
        return [()] * n
    think = (rng.exponential(cfg.think_s, size=(n, k)) if cfg.think == "exponential"
             else np.full((n, k), cfg.think_s))
    messages, _ = sample_lengths(cfg.message_len, n * k, rng, "human")
    return [tuple(FollowUp(float(think[s, j]), (("message", *key, s, j + 2), int(messages[s * k + j])),
                           int(outputs[s * k + j]), ("answer", *key, s, j + 1))
                  for j in range(k))
            for s in range(n)]


class Conversations:
    """The sessions of one run: makes each next turn when the driver hands back the previous one."""

    def __init__(self, trace: list[TraceItem], first_turns: list[Request], t0: float, end_s: float,
                 vocab: int | None, prepare: Callable[[Request], None] | None = None):
        self.plans = {r.session_id: item.session for item, r in zip(trace, first_turns)}
        self.sessions = len(trace)
        self.t0, self.end = t0, t0 + end_s          # no turn arrives at or after `end` (clock time)
        self.vocab = vocab
        self.prepare = prepare
        self.first_turns = first_turns
        self.later: list[Request] = []              # turns 2.., in the order they were made
        self.ended: Counter[str] = Counter()        # why sessions stopped: done, failed, cut

    def next_turn(self, done: Request) -> Request | None:
        """The turn after `done` (finished or failed), planned at its arrival time; None when the
        session is over. A turn the backend refuses (prepare: longer than the context) is kept,
        failed, and ends its session."""
        plan = self.plans.get(done.session_id)
        if plan is None:
            return None
        if done.status is Status.FAILED:
            self.ended["failed"] += 1
            return None
        if done.turn > len(plan):
            self.ended["done"] += 1
            return None
        f = plan[done.turn - 1]
        arrival = done.token_times[-1] + f.think_s
        if arrival >= self.end:
            self.ended["cut"] += 1
            return None
        r = self._request(done, f, arrival)
        self.later.append(r)
        if r.prompt_len > MAX_LENGTH:
            r.fail(f"invalid request: the conversation reached {r.prompt_len:,} tokens, over the limit of {MAX_LENGTH:,}")
        if r.is_done or not r.prepared(self.prepare):
            self.ended["failed"] += 1
            return None
        return r

    def _request(self, done: Request, f: FollowUp, arrival: float) -> Request:
        turn = done.turn + 1
        root = done.request_id.split("-t")[0]
        n = done.prompt_len + done.output_len + f.message[1]
        ids = None
        if n <= MAX_LENGTH:                         # else refused in next_turn, without building the ids
            answer = done.output_token_ids
            if len(answer) != done.output_len:      # the backend produced no ids: placeholders
                answer = segment_ids(f.placeholder, done.output_len, self.vocab).tolist()
            ids = [*done.prompt_token_ids, *answer, *token_ids((f.message,), self.vocab)]
        return Request(f"{root}-t{turn}", n, f.output_len, arrival, prompt_token_ids=ids,
                       index=(turn - 1) * self.sessions + done.session_id, session_id=done.session_id,
                       turn=turn, prefix_group=done.prefix_group)

    def requests(self) -> list[Request]:
        """Every turn made, in (session, turn) order: a session's rows stay together."""
        return sorted(self.first_turns + self.later, key=lambda r: (r.session_id, r.turn))
