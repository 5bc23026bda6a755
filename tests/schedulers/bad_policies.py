"""Policies that break the scheduler contract, for tests/schedulers/test_guard.py."""
from batchlab.core.request import Status
from batchlab.core.work import Idle, Step
from batchlab.schedulers import ContinuousScheduler, Scheduler


class TooManyRows(ContinuousScheduler):
    """Runs every waiting request at once, whatever max_num_seqs says."""

    def schedule(self, now, draining=False):
        while self.waiting:
            r = self.waiting.popleft()
            r.status, r.scheduled_time = Status.RUNNING, r.scheduled_time or now
            self.running.append(r)
        chunks = [(r, r.num_tokens - r.num_computed_tokens) for r in self.running]
        return Step(chunks) if chunks else Idle()


class LosesRequests(ContinuousScheduler):
    """Forgets the newest waiting request, once, from its third step on."""

    steps = 0
    dropped = False

    def finish_step(self, step, now):
        self.steps += 1
        if self.steps >= 3 and self.waiting and not self.dropped:
            self.waiting.pop()
            self.dropped = True
        return super().finish_step(step, now)


class Raises(ContinuousScheduler):
    """A bug in the policy: schedule() raises on its fifth call."""

    calls = 0

    def schedule(self, now, draining=False):
        self.calls += 1
        if self.calls == 5:
            raise ZeroDivisionError("division by zero")
        return super().schedule(now, draining)


class NotAScheduler:
    pass


class NoLevel(Scheduler):
    def schedule(self, now, draining=False):
        return Idle()
