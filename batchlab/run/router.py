"""Routers: which replica an arriving request goes to.

Round-robin goes by turn; least-outstanding picks the replica with the fewest assigned-but-
unfinished requests (ties by turn, so light traffic still spreads evenly); cache-aware picks the
replica whose prefix cache holds most of the request's prompt, bounded by load. A router sees the
replicas' state at the moment of each arrival.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, TypeVar

from batchlab.core.request import Request


class Candidate(Protocol):
    """What a router may look at: a replica's position, its assigned-but-unfinished count, and
    how many of a request's prompt tokens its prefix cache holds now."""
    index: int
    outstanding: int

    def cached_tokens(self, request: Request) -> int: ...


Replica = TypeVar("Replica", bound=Candidate)


class Router(ABC):
    """Picks the replica for each arriving request; sees the replicas' state at that moment."""

    def __init__(self) -> None:
        self.turn = 0

    @abstractmethod
    def pick(self, replicas: list[Replica], request: Request) -> Replica: ...


class RoundRobin(Router):
    def pick(self, replicas: list[Replica], request: Request) -> Replica:
        chosen = replicas[self.turn % len(replicas)]
        self.turn += 1
        return chosen


class LeastOutstanding(Router):
    def pick(self, replicas: list[Replica], request: Request) -> Replica:
        n = len(replicas)
        # NOTE: ties go by turn, not to replica 0, so light traffic still spreads evenly.
        chosen = min(replicas, key=lambda r: (r.outstanding, (r.index - self.turn) % n))
        self.turn = chosen.index + 1
        return chosen


class CacheAware(Router):
    """The rule: among replicas with at most `slack` more outstanding requests than the least
    loaded one, take the one whose cache holds the most of the request's prompt; ties (and a
    prompt cached nowhere) go to the fewest outstanding, then by turn, as least-outstanding.
    NOTE: the slack bounds how much queueing a hit may cost: a popular prefix spills over to
    other replicas (which then cache it too) instead of piling up on one."""

    slack = 8                          # requests

    def pick(self, replicas: list[Replica], request: Request) -> Replica:
        n = len(replicas)
        least = min(r.outstanding for r in replicas)
        near = [r for r in replicas if r.outstanding <= least + self.slack]
        hits = {r.index: r.cached_tokens(request) for r in near}
        chosen = min(near, key=lambda r: (-hits[r.index], r.outstanding, (r.index - self.turn) % n))
        self.turn = chosen.index + 1
        return chosen


ROUTERS: dict[str, type[Router]] = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding,
                                    "cache_aware": CacheAware}
