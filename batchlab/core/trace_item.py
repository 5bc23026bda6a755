"""One planned request of a trace: when it arrives, its lengths, and what its prompt shares.

Plain traffic has neither `content` nor `session`: backends make up their own prompts, as they
always did. Traffic with shared content (prefix groups, sessions, Mooncake hash ids) describes its
prompt as segments (core/content.py), which every backend turns into the same token ids.
"""
from __future__ import annotations

from dataclasses import dataclass

from batchlab.core.content import Segment


@dataclass(frozen=True, slots=True)
class FollowUp:
    """A later turn of a session, planned with the trace (so it depends on the seed only); when
    it arrives is known only at run time: think_s after the previous turn's answer finished."""
    think_s: float          # seconds after the previous answer's last token
    message: Segment        # the new user message
    output_len: int         # tokens to generate
    placeholder: tuple      # key of ids standing in for the previous answer when a backend has none (sim)


@dataclass(frozen=True, slots=True)
class User:
    """A closed-loop user (traffic.arrival closed): the trace holds its first request; the rest are
    drawn at run time from its own stream, seeded by (traffic.seed, repeat, number)."""
    number: int
    repeat: int


@dataclass(frozen=True, slots=True)
class TraceItem:
    arrival: float          # seconds after the run's start
    prompt_len: int         # tokens
    output_len: int         # tokens to generate
    prompt: str = ""        # text, when the source has it (ShareGPT, trace file)
    content: tuple[Segment, ...] = ()           # the prompt's shared content; () = none (backend's own prompt)
    prefix_group: int | None = None             # traffic.prefix: which shared system prompt
    session: tuple[FollowUp, ...] | None = None  # traffic.sessions: this is turn 1; turns 2.. follow
    klass: str | None = None                    # traffic.classes: the class's name
    tenant: str | None = None                   # traffic.classes: who sent it
    priority: int = 0                           # traffic.classes: lower runs first under `priority`
    user: User | None = None                    # traffic.arrival closed: this is the user's first request
