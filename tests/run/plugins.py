"""A backend kind and a strategy defined outside batchlab, as a plugin author would write them:
one module each would do; tests/run/test_config.py registers them and runs a sweep."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from batchlab.backends.base import BackendOptions, Engine, EngineFacts
from batchlab.core.config import Model
from batchlab.core.work import Batch, Idle
from batchlab.schedulers.base import Given, RequestLevelScheduler


class Metronome(Engine):
    """Every step of every batch takes `tick_s` of virtual time."""
    virtual_time = True

    def __init__(self, tick_s: float):
        self.tick_s = tick_s

    def facts(self) -> EngineFacts:
        return EngineFacts(frozenset({"request"}))

    def describe(self) -> dict:
        return {"model": f"metronome {self.tick_s:g} s"}

    async def run_batch(self, requests, clock) -> None:
        for i in range(max(r.max_new_tokens for r in requests)):
            await clock.sleep(self.tick_s)
            for r in requests:
                if i < r.max_new_tokens:
                    r.stamp_token(clock.now())


class MetronomeOptions(BackendOptions):
    """A toy engine: each step takes tick_s."""
    kind: Literal["metronome"] = "metronome"
    tick_s: Annotated[float, Field(gt=0)] = 0.01
    """Seconds per step."""

    def build(self, cfg) -> Metronome:
        return Metronome(self.tick_s)


class PairsConfig(Model):
    """Batches of exactly two (the last one alone when draining)."""
    wait: bool = True
    """Wait for a partner; False: run whatever is waiting at once."""


class PairsScheduler(RequestLevelScheduler):
    name, options_model, title = "pairs", PairsConfig, "Pairs"

    def __init__(self, options: PairsConfig):
        super().__init__()
        self.options = options

    @classmethod
    def from_config(cls, cfg, given: Given) -> PairsScheduler:
        return cls(cfg.pairs)

    @classmethod
    def batch_rows(cls, cfg) -> int:
        return 2

    def schedule(self, now: float, draining: bool = False) -> Batch | Idle:
        if self.running or not self.waiting:
            return Idle()
        if len(self.waiting) >= 2:
            return self.launch(2, now, "size")
        return self.launch(1, now, "drain") if draining or not self.options.wait else Idle()
