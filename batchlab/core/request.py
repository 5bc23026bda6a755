"""A request carries its own timestamps; every metric is computed from them (core/metrics.py).

Stamps: `arrival_time` (planned arrival, not when a coroutine woke), `scheduled_time` (first
admitted to a batch or step), and one entry in `token_times` per output token. First-token and
completion times are derived from `token_times`, so they can never disagree with it.
Progress is tracked vLLM-style: `num_computed_tokens` (KV in cache) against `num_tokens`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum


class Status(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_len: int                  # tokens
    max_new_tokens: int              # target output length: every backend produces exactly this many
    arrival_time: float              # seconds on the run's clock (planned arrival)
    prompt: str = ""                 # text, when a backend needs one
    prompt_token_ids: list[int] | None = None
    index: int = 0                   # position in the trace (deterministic tie-breaks)

    scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)     # one stamp per output token
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    status: Status = Status.QUEUED
    error: str | None = None
    num_computed_tokens: int = 0     # tokens whose KV is cached (prompt + generated)
    num_preemptions: int = 0
    # Seconds spent in each phase, filled by the scheduler/driver (see core/breakdown.py).
    breakdown: dict[str, float] = field(default_factory=dict)
    trigger: str = ""                # what launched this request's batch (size / age / memory / drain)
    # Traffic with shared content (core/sessions.py, core/traffic.py): None for plain traffic.
    session_id: int | None = None    # traffic.sessions: the conversation (its first turn's trace index)
    turn: int | None = None          # traffic.sessions: 1 for the first message, 2 for the next, ...
    prefix_group: int | None = None  # traffic.prefix: the shared system prompt this prompt starts with
    num_cached_tokens: int = 0       # prompt tokens reused from the prefix cache at its latest admission
    # Traffic classes (traffic.classes): who sent it and how urgent it is; None/0 for plain traffic.
    klass: str | None = None         # the class's name ("class" is a keyword)
    tenant: str | None = None
    priority: int = 0                # lower runs first (vLLM's convention)
    predicted_output: int | None = None   # an SJF predictor's guess at max_new_tokens (None: oracle)
    # When the scheduler got it: past any front end and delay (the driver's inbox stamps it; None
    # for a request handed to a scheduler some other way). A simulator tells by it whether a
    # step took the request as it came or from a queue.
    handed_time: float | None = None

    @property
    def output_len(self) -> int:
        return len(self.token_times)

    @property
    def num_tokens(self) -> int:
        """Prompt plus tokens generated so far: what the KV cache must hold once caught up."""
        return self.prompt_len + len(self.token_times)

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def completion_time(self) -> float | None:
        return self.token_times[-1] if self.status is Status.FINISHED and self.token_times else None

    @property
    def is_done(self) -> bool:
        return self.status in (Status.FINISHED, Status.FAILED)

    def stamp_token(self, t: float, token_id: int | None = None) -> None:
        self.token_times.append(t)
        if token_id is not None:
            self.output_token_ids.append(token_id)

    def prepared(self, prepare: Callable[[Request], None] | None) -> bool:
        """Hand this request to a backend's `prepare`; one it refuses (ValueError: an empty prompt,
        longer than the model's context) fails with the reason, as a server would answer it with a
        400, and is kept in the results. False when refused."""
        if prepare is not None:
            try:
                prepare(self)
            except ValueError as e:
                self.fail(f"invalid request: {e}")
                return False
        return True

    def fail(self, error: str) -> None:
        self.status = Status.FAILED
        self.error = error

    def add_time(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            self.breakdown[phase] = self.breakdown.get(phase, 0.0) + seconds
