"""The engine's decode step against generate()'s on the tiny model: both measured at the batch asked
for, from the steps that ran that many rows (values are not judged: no timing assertions)."""
import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends.hf import HFOptions  # noqa: E402
from batchlab.backends.hf_backend import HFBackend  # noqa: E402
from batchlab.baselines.decode_step import kv_blocks, step_times  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.traffic import TraceItem  # noqa: E402


def test_kv_blocks_hold_every_sequence_at_its_longest():
    trace = [TraceItem(0.0, 30, 10), TraceItem(0.0, 3, 2)]
    assert kv_blocks(trace, 4) == 4 * 3 + 4                    # 40 tokens: 3 blocks of 16, per row, plus one each


def test_both_steps_are_measured_at_the_batch_asked_for(tiny_model_dir):
    hf = HFBackend(HFOptions(model=str(tiny_model_dir), device="cpu", dtype="float32", warmup_batches=0))
    clock = RealClock()
    clock.run(hf.start(clock))
    try:
        engine, generate = clock.run(step_times(hf, 3, clock, p=8, o=6))
        full = [s for s in hf.engine.step_log if s.rows == 3 and s.prefill_tokens == 0]
    finally:
        clock.run(hf.close())
    assert engine > 0 and generate > 0 and len(full) == 5, len(full)   # o - 1 decode steps at full occupancy
