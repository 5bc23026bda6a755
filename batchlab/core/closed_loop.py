"""Closed-loop traffic (traffic.arrival: closed): a fixed number of users, each sending its next
request the moment its previous answer ends.

A point's load is then its number of users, not a rate: throughput rises with users until the
backend saturates, and from there on each added user only waits longer (Little's law: users =
throughput x latency). All users send their first request at the point's start. User u's next
request arrives exactly when its previous answer's last token was stamped (a failed one: when it
was handed back), so at no time are more than `users` requests in the system; that is what tells
a closed loop from an open one, and what its tests check.
Lengths come from one seeded stream per user, drawn in the user's own order: the same (seed,
repeat, user, k) always gives the same request, whatever the backend or how fast it ran; how
many requests a user gets to send is known only at run time. A user stops when its next request
would arrive at or after the end of the point's traffic (every arrival lies inside the window the
metrics use), after `per_user` requests when a caller sets that, when the backend refuses its
request before running it (longer than the model's context: recorded as failed), or, for every
user, once the first FAIL_FAST_AFTER answers have all failed (a dead server must not be hammered
until the end). A point never makes more than MAX_REQUESTS_PER_POINT requests.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from batchlab.core.clock import Clock
from batchlab.core.config import TrafficConfig
from batchlab.core.limits import MAX_REQUESTS_PER_POINT
from batchlab.core.request import Request, Status
from batchlab.core.sessions import Conversations
from batchlab.core.trace_item import TraceItem, User

FAIL_FAST_AFTER = 20         # answers: all of the first this many failing stops every user (as an open loop's senders)
STREAM_TAG = 0xC105ED        # keeps the users' streams apart from the open-loop trace's


def user_streams(traffic: TrafficConfig, users: int, repeat: int) -> list[np.random.Generator]:
    """One length stream per user, seeded by (seed, repeat, user)."""
    return [np.random.default_rng([traffic.seed, repeat, STREAM_TAG, u]) for u in range(users)]


def draw(traffic: TrafficConfig, rng: np.random.Generator) -> tuple[int, int, str]:
    """A user's next request: prompt length, output length, prompt text (ShareGPT lengths only)."""
    from batchlab.core.traffic import sample_lengths  # NOTE: traffic imports this module
    prompts, text = sample_lengths(traffic.prompt_len, 1, rng, "human")
    outputs, _ = sample_lengths(traffic.output_len, 1, rng, "gpt")
    return int(prompts[0]), int(outputs[0]), text[0] if text else ""


def first_requests(traffic: TrafficConfig, users: int, repeat: int) -> list[TraceItem]:
    """The trace of a closed-loop point: every user's first request, all at offset 0, in user order."""
    return [TraceItem(0.0, *draw(traffic, rng), user=User(u, repeat))
            for u, rng in enumerate(user_streams(traffic, users, repeat))]


class ClosedLoop:
    """The users of one point (`trace`: their first requests, `first`: the requests made of them):
    makes each user's next request when the driver (or a load target) hands back its previous
    one. Same interface as core/sessions.Conversations."""

    def __init__(self, traffic: TrafficConfig, trace: list[TraceItem], first: list[Request], clock: Clock,
                 t0: float, end_s: float | None = None, prepare: Callable[[Request], None] | None = None,
                 per_user: int | None = None):
        self.traffic, self.clock = traffic, clock
        repeat = trace[0].user.repeat if trace else 0
        self.sessions = len(first)
        self.first_turns = first
        self.end = t0 + (traffic.horizon_s if end_s is None else end_s)
        self.prepare = prepare
        self.per_user = per_user
        self.streams = user_streams(traffic, len(first), repeat)
        for rng in self.streams:                 # the first requests came from these draws (first_requests)
            draw(traffic, rng)
        self.sent = [1] * len(first)             # requests made per user so far
        self.later: list[Request] = []
        self.ended: Counter[str] = Counter()     # why users stopped: cut (the end), done (per_user), refused,
                                                 # failed (all first answers), capped (the point's request cap)
        self.answers = 0
        self.failures = 0
        self.stopped: str | None = None          # set once every user must stop

    def next_turn(self, done: Request) -> Request | None:
        """User `done.session_id`'s next request, arriving when `done` came back: its last token's
        stamp, or for a failed one the clock's reading now; None when that user is finished."""
        u = done.session_id
        if u is None or u >= self.sessions:
            return None
        self.answers += 1
        self.failures += done.status is Status.FAILED
        if self.stopped is None and self.answers == FAIL_FAST_AFTER == self.failures:
            self.stopped = "failed"
        if self.stopped is None and len(self.first_turns) + len(self.later) >= MAX_REQUESTS_PER_POINT:
            self.stopped = "capped"
        if self.stopped is not None:
            self.ended[self.stopped] += 1
            return None
        if self.per_user is not None and self.sent[u] >= self.per_user:
            self.ended["done"] += 1
            return None
        arrival = done.token_times[-1] if done.status is Status.FINISHED else self.clock.now()
        if arrival >= self.end:
            self.ended["cut"] += 1
            return None
        k = self.sent[u]
        self.sent[u] += 1
        prompt_len, output_len, text = draw(self.traffic, self.streams[u])
        r = Request(f"u{u:05d}-{k:06d}", prompt_len, output_len, arrival, prompt=text,
                    index=k * self.sessions + u, session_id=u)
        self.later.append(r)
        if not r.prepared(self.prepare):
            # NOTE: refused before it runs (longer than the model's context): it is recorded, and
            # its user stops, or it would send its next request at this same instant
            self.ended["refused"] += 1
            return None
        return r

    def requests(self) -> list[Request]:
        """Every request made, user by user, each user's in the order sent."""
        return sorted(self.first_turns + self.later, key=lambda r: (r.session_id, r.index))


def follow_ups(traffic: TrafficConfig, trace: list[TraceItem], first: list[Request], clock: Clock, t0: float,
               vocab: int | None, prepare: Callable[[Request], None] | None) -> ClosedLoop | Conversations | None:
    """What plans requests while a point runs: its users (closed loop), its conversations
    (traffic.sessions), or nothing (every arrival is in the trace)."""
    if trace and trace[0].user is not None:
        return ClosedLoop(traffic, trace, first, clock, t0, prepare=prepare)
    if trace and trace[0].session is not None:
        return Conversations(trace, first, t0, traffic.horizon_s, vocab, prepare)
    return None
