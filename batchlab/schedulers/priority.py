"""Priority scheduling on the continuous machinery (vLLM's `--scheduling-policy priority`).

Lower `priority` runs first (traffic.classes sets it per class); ties go to the earlier arrival.
Admission takes the most urgent waiting request; out of KV blocks mid-decode, the least urgent
running request is preempted (newest among equals). With `preempt`, a waiting request that
outranks a running one and finds no room (sequence slots or blocks) takes it: the running one is
preempted and recomputes later, as in vLLM.
"""
from __future__ import annotations

from collections.abc import Callable

from batchlab.core.config import Model
from batchlab.core.request import Request
from batchlab.core.work import Idle, Step
from batchlab.schedulers.continuous import ContinuousScheduler
from batchlab.schedulers.queues import KeyedAdmission


class PriorityConfig(Model):
    """Iteration-level priority (traffic.classes' `priority`, lower first): admission by priority,
    then arrival; out of room, the lowest-priority running request is preempted, as vLLM's
    `--scheduling-policy priority` does."""
    preempt: bool = True
    """Preempt lower-priority running requests for a waiting higher one."""


def urgency(r: Request) -> tuple[int, float, int]:
    return r.priority, r.arrival_time, r.index


class PriorityScheduler(KeyedAdmission):
    name, options_model, runs_under = "priority", PriorityConfig, ("continuous",)
    title, color, compared_with = "Priority", "#E69F00", "continuous"

    def order_key(self, r: Request) -> tuple:
        return urgency(r)

    def victim(self) -> Request:
        return max(self.running, key=urgency)

    def schedule(self, now: float, draining: bool = False) -> Step | Idle:
        if not self.options.preempt:
            return super().schedule(now, draining)
        return schedule_making_way(self, now, draining, lambda best, worst: worst.priority > best.priority)


def schedule_making_way(s: ContinuousScheduler, now: float, draining: bool,
                        outranks: Callable[[Request, Request], bool]) -> Step | Idle:
    """`s.schedule()`, after preempting running requests (s.victim() first) that the next waiting
    request outranks, while it finds no room (sequence slots or KV blocks)."""
    victims = []
    if s.waiting and s.running:
        best = s.next_waiting(now)
        need = s.pool.blocks_for(best, best.num_tokens)
        while s.running:
            worst = s.victim()
            full = len(s.running) >= s.cfg.max_num_seqs or s.pool.free < need
            if not full or not outranks(best, worst):
                break
            s._preempt(worst)
            victims.append(worst)
    out = ContinuousScheduler.schedule(s, now, draining)
    if victims:
        # NOTE: the backend must drop their KV before the step; a step always follows, since
        # the request they made way for now fits (it is admitted alone if need be).
        out = out if isinstance(out, Step) else Step([])
        out.preempted[:0] = victims
        out.repeat = out.booked = 1
    return out
