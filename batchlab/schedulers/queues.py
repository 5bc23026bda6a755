"""The waiting queue in another order than arrival, cheaply: a heap beside `waiting`.

A policy that admits by a key (priority, predicted length) would otherwise scan every waiting
request at every admission, which past capacity (tens of thousands waiting) makes a simulated
minute take hours. `KeyedQueue` keeps the same requests in a heap with lazy deletion: push,
discard and peek in O(log n). `waiting` itself stays the source of truth the driver reads.
"""
from __future__ import annotations

import heapq
from itertools import count

from batchlab.core.request import Request
from batchlab.schedulers.continuous import ContinuousScheduler


class KeyedQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[tuple, int, Request]] = []
        self._live: dict[Request, int] = {}      # request -> the sequence number of its live entry
        self._seq = count()

    def push(self, r: Request, key: tuple) -> None:
        """Add r (or move it: an earlier entry of r goes stale)."""
        n = next(self._seq)
        self._live[r] = n
        heapq.heappush(self._heap, (key, n, r))

    def discard(self, r: Request) -> None:
        self._live.pop(r, None)

    def peek(self) -> Request:
        heap, live = self._heap, self._live
        while live.get(heap[0][2]) != heap[0][1]:    # stale: taken, aborted or pushed again
            heapq.heappop(heap)
        return heap[0][2]

    def __len__(self) -> int:
        return len(self._live)


class KeyedAdmission(ContinuousScheduler):
    """Continuous batching that admits the waiting request with the smallest `order_key` (a key
    that does not change while the request waits), through a KeyedQueue."""

    def order_key(self, r: Request) -> tuple:
        raise NotImplementedError

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.order = KeyedQueue()

    def add(self, request: Request) -> None:
        super().add(request)
        self.order.push(request, self.order_key(request))

    def next_waiting(self, now: float) -> Request:
        return self.order.peek()

    def _take(self, r: Request) -> None:
        super()._take(r)
        self.order.discard(r)

    def _preempt(self, victim: Request) -> None:
        super()._preempt(victim)
        self.order.push(victim, self.order_key(victim))

    def abort(self, request: Request) -> bool:
        gone = super().abort(request)
        if gone:
            self.order.discard(request)
        return gone
