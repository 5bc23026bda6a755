"""Backend interfaces: two shapes, because batching happens in two different places.

- We batch (simulator, Hugging Face): `BatchBackend.run_batch` runs a whole request-level batch
  (padded, lockstep, to the longest output), `StepBackend.step` runs one iteration of a batch
  that changes every step. Both stamp every token through the clock they are given.
- The server batches (any OpenAI-compatible endpoint): see backends/openai.py; one request in,
  a stream of stamped chunks out.
Every backend produces exactly `max_new_tokens` tokens per request (EOS ignored), so no
strategy gets shorter answers.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from batchlab.core.clock import Clock
from batchlab.core.request import Request
from batchlab.schedulers.base import MemoryBudget, Step


class OutOfMemory(RuntimeError):
    """The batch did not fit in the device's memory. Dynamic batching backs off and retries."""


class Backend(ABC):
    """What the driver and the runner need from any backend we batch for."""

    virtual_time: bool = False        # True: runs on a VirtualClock (the simulator)

    def describe(self) -> dict[str, Any]:
        """Setup facts for reports: device, model, dtype, library versions."""
        return {}

    def memory_budget(self) -> MemoryBudget | None:
        """KV budget for dynamic batching's memory trigger; None disables that trigger."""
        return None

    def num_kv_blocks(self, block_size: int) -> int | None:
        """KV capacity in blocks when the config does not set `continuous.num_kv_blocks`."""
        return None

    def prepare(self, request: Request) -> None:
        """Called once when a request is created (e.g. tokenize it). Raise ValueError if invalid."""

    async def start(self, clock: Clock) -> None:
        """Load / warm up before a measured run. Warm-up work is not part of any metric."""

    async def close(self) -> None:
        """Release resources."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (called before each measured run)."""

    def peak_memory(self) -> dict[str, Any]:
        """{'peak_mem_bytes': int, 'peak_mem_kind': str} for the last run, or {}."""
        return {}


class BatchBackend(Backend):
    @abstractmethod
    async def run_batch(self, requests: list[Request], clock: Clock) -> None:
        """Run the batch to completion: stamp exactly `max_new_tokens` tokens on every request.
        Raise OutOfMemory if it does not fit; any other exception fails the whole batch."""


class StepBackend(Backend):
    @abstractmethod
    async def step(self, step: Step, clock: Clock) -> None:
        """One forward pass: compute each chunk's tokens; every request whose computed tokens
        reach its `num_tokens` after this step gets one new token stamped at the step's end."""

    def release(self, request: Request) -> None:
        """Free engine-side state (KV) of a finished, failed or preempted request."""
