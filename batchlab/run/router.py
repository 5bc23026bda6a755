"""Routers: which replica an arriving request goes to.

Round-robin goes by turn; least-outstanding picks the replica with the fewest assigned-but-
unfinished requests (ties by turn, so light traffic still spreads evenly). A router sees the
replicas' state at the moment of each arrival.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, TypeVar


class Candidate(Protocol):
    """What a router may look at: a replica's position and its assigned-but-unfinished count."""
    index: int
    outstanding: int


Replica = TypeVar("Replica", bound=Candidate)


class Router(ABC):
    """Picks the replica for each arriving request; sees the replicas' state at that moment."""

    def __init__(self) -> None:
        self.turn = 0

    @abstractmethod
    def pick(self, replicas: list[Replica]) -> Replica: ...


class RoundRobin(Router):
    def pick(self, replicas: list[Replica]) -> Replica:
        chosen = replicas[self.turn % len(replicas)]
        self.turn += 1
        return chosen


class LeastOutstanding(Router):
    def pick(self, replicas: list[Replica]) -> Replica:
        n = len(replicas)
        # NOTE: ties go by turn, not to replica 0, so light traffic still spreads evenly.
        chosen = min(replicas, key=lambda r: (r.outstanding, (r.index - self.turn) % n))
        self.turn = chosen.index + 1
        return chosen


ROUTERS: dict[str, type[Router]] = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding}
