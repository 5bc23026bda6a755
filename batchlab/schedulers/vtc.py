"""Virtual token counter fair sharing across tenants (Sheng et al., OSDI 2024), on the continuous
machinery.

Each tenant has a counter of the service it received: `prefill_weight` per prompt token when a
request is first admitted, `decode_weight` per output token as it is generated. Admission takes
the next waiting request of the backlogged tenant with the smallest counter (each tenant's own
queue is first come, first served; equal counters go to the earlier arrival). A tenant that had
nothing waiting is lifted to the smallest counter among the backlogged ones when it sends again
(or to the last admitted tenant's counter if none is), so idle time is not banked as credit.
The paper proves the service received by any two backlogged tenants over any interval differs
by at most 2U, U = max(w_p x longest prompt, w_q x tokens the batch can hold).
Out of KV blocks, the newest running request is preempted, as under FCFS.
"""
from __future__ import annotations

from collections import deque
from typing import Annotated

from pydantic import Field

from batchlab.core.config import Model
from batchlab.core.request import Request
from batchlab.core.work import Step
from batchlab.schedulers.continuous import ContinuousScheduler


class VTCConfig(Model):
    """Virtual token counter fair share across tenants (Sheng et al., "Fairness in Serving Large
    Language Models", OSDI 2024): admit from the tenant that has received the least weighted
    service; a tenant returning from idle is lifted to the least backlogged counter."""
    prefill_weight: Annotated[float, Field(gt=0, le=1000)] = 1.0
    """The paper's w_p, per prompt token."""
    decode_weight: Annotated[float, Field(gt=0, le=1000)] = 2.0
    """The paper's w_q, per output token."""


def tenant_of(r: Request) -> str:
    return r.tenant if r.tenant is not None else ""


class VTCScheduler(ContinuousScheduler):
    name, options_model, runs_under = "vtc", VTCConfig, ("continuous",)
    title, short, color, compared_with = "VTC fair-share", "VTC", "#999999", "continuous"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counter: dict[str, float] = {}
        self.queues: dict[str, deque[Request]] = {}  # each tenant's waiting requests, in order
        self.generated: dict[Request, int] = {}
        self.last = 0.0                        # counter of the tenant admitted last

    def add(self, request: Request) -> None:
        t = tenant_of(request)
        q = self.queues.setdefault(t, deque())
        if not q:                              # returning from idle: no credit for the idle time
            backlogged = [self.counter[u] for u, w in self.queues.items() if w]
            self.counter[t] = max(self.counter.get(t, 0.0), min(backlogged, default=self.last))
        q.append(request)
        super().add(request)

    def next_waiting(self, now: float) -> Request:
        """The next waiting request of the least-served tenant; equal counters (a tenant just
        lifted) go to the earlier arrival."""
        heads = [q[0] for q in self.queues.values() if q]
        return min(heads, key=lambda r: (self.counter[tenant_of(r)], r.arrival_time, r.index))

    def _take(self, r: Request) -> None:
        super()._take(r)
        t = tenant_of(r)
        self.queues[t].remove(r)               # its head, unless it was refused as too big
        # first admission only (a preempted one is not charged twice), and not one refused as too big
        if r.scheduled_time is None and self.pool.can_ever_fit(r):
            self.counter[t] += self.options.prefill_weight * (r.prompt_len - r.num_cached_tokens)
        self.last = self.counter[t]

    def _preempt(self, victim: Request) -> None:
        super()._preempt(victim)
        self.queues[tenant_of(victim)].appendleft(victim)    # it goes back first, as under FCFS

    def finish_step(self, step: Step, now: float) -> list[Request]:
        for r, _ in step.chunks:
            new = len(r.token_times) - self.generated.get(r, 0)
            if new:
                self.generated[r] = len(r.token_times)
                self.counter[tenant_of(r)] += self.options.decode_weight * new
        done = super().finish_step(step, now)
        for r in done:
            self.generated.pop(r, None)
        return done

    def abort(self, request: Request) -> bool:
        q = self.queues.get(tenant_of(request))
        waiting = q is not None and request in q
        gone = super().abort(request)
        if gone and waiting:
            q.remove(request)
        self.generated.pop(request, None)
        return gone
