"""Fakes for unit tests: a backend where every step costs exactly one time unit."""
from __future__ import annotations

from batchlab.backends.base import Engine, EngineFacts, OutOfMemory
from batchlab.core.request import Request
from batchlab.core.work import Step


class UnitStepBackend(Engine):
    """Each forward pass takes `step` seconds, whatever it contains. Optionally raises
    OutOfMemory for batches larger than `oom_above` rows."""

    virtual_time = True

    def facts(self) -> EngineFacts:
        return EngineFacts(frozenset({"request", "iteration"}))

    def __init__(self, step: float = 1.0, oom_above: int | None = None):
        self.dt = step
        self.oom_above = oom_above
        self.batches: list[list[str]] = []
        self.released: list[str] = []

    async def run_batch(self, requests: list[Request], clock) -> None:
        if self.oom_above is not None and len(requests) > self.oom_above:
            raise OutOfMemory(f"{len(requests)} rows > {self.oom_above}")
        self.batches.append([r.request_id for r in requests])
        for i in range(max(r.max_new_tokens for r in requests)):
            await clock.sleep(self.dt)
            for r in requests:
                if i < r.max_new_tokens:
                    r.stamp_token(clock.now())

    async def step(self, step: Step, clock) -> int:
        await clock.sleep(self.dt)
        for r, n in step.chunks:
            if r.num_computed_tokens + n >= r.num_tokens:
                r.stamp_token(clock.now())
        return 1

    def release(self, request: Request) -> None:
        self.released.append(request.request_id)


def make_requests(arrivals, outputs, prompt_len: int = 1) -> list[Request]:
    return [Request(f"R{i + 1}", prompt_len, o, float(a), index=i)
            for i, (a, o) in enumerate(zip(arrivals, outputs))]
