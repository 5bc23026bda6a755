"""Virtual token counter fair sharing across tenants (Sheng et al., OSDI 2024), on the continuous
machinery.

Each tenant has a counter of the service it received: `prefill_weight` per prompt token when a
request is first admitted, `decode_weight` per output token as it is generated. Admission takes
the oldest waiting request of the backlogged tenant with the smallest counter (equal counters:
the earlier arrival). A tenant that had nothing waiting is lifted to the smallest counter among
the backlogged ones when it sends again (or to the last admitted tenant's counter if none is),
so idle time is not banked as credit. The paper proves the service received by any two
backlogged tenants over any interval differs by at most 2U, U = max(w_p x longest prompt,
w_q x tokens the batch can hold).
Out of KV blocks, the newest running request is preempted, as under FCFS.
"""
from __future__ import annotations

from batchlab.core.config import ContinuousConfig, VTCConfig
from batchlab.core.request import Request
from batchlab.core.work import Step
from batchlab.schedulers.continuous import ContinuousScheduler


def tenant_of(r: Request) -> str:
    return r.tenant if r.tenant is not None else ""


class VTCScheduler(ContinuousScheduler):
    options_section = "vtc"

    def __init__(self, cfg: ContinuousConfig, num_kv_blocks: int, policy: str = "recompute",
                 options: VTCConfig = VTCConfig()):
        super().__init__(cfg, num_kv_blocks, policy)
        self.options = options
        self.counter: dict[str, float] = {}
        self.queued: dict[str, int] = {}       # waiting requests per tenant
        self.generated: dict[Request, int] = {}
        self.last = 0.0                        # counter of the tenant admitted last

    def add(self, request: Request) -> None:
        t = tenant_of(request)
        if not self.queued.get(t):             # returning from idle: no credit for the idle time
            backlogged = [self.counter[u] for u, n in self.queued.items() if n]
            self.counter[t] = max(self.counter.get(t, 0.0), min(backlogged, default=self.last))
        self.queued[t] = self.queued.get(t, 0) + 1
        super().add(request)

    def next_waiting(self, now: float) -> Request:
        """The oldest waiting request of the least-served tenant; equal counters (a tenant just
        lifted) go to the earlier arrival."""
        first: dict[str, Request] = {}
        for r in self.waiting:
            t = tenant_of(r)
            if t not in first or (r.arrival_time, r.index) < (first[t].arrival_time, first[t].index):
                first[t] = r
        return min(first.values(), key=lambda r: (self.counter[tenant_of(r)], r.arrival_time, r.index))

    def _take(self, r: Request) -> None:
        super()._take(r)
        t = tenant_of(r)
        self.queued[t] -= 1
        # first admission only (a preempted one is not charged twice), and not one refused as too big
        if r.scheduled_time is None and self.pool.can_ever_fit(r):
            self.counter[t] += self.options.prefill_weight * (r.prompt_len - r.num_cached_tokens)
        self.last = self.counter[t]

    def _preempt(self, victim: Request) -> None:
        super()._preempt(victim)
        self.queued[tenant_of(victim)] = self.queued.get(tenant_of(victim), 0) + 1

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
        waiting = request in self.waiting
        gone = super().abort(request)
        if gone and waiting:
            self.queued[tenant_of(request)] -= 1
        self.generated.pop(request, None)
        return gone
