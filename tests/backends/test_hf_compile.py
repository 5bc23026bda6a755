"""Bucketed decode (backends/hf_compile.py): padding rows change no token, compiled or not.

The padding logic is checked on the eager pass (fast); torch.compile itself once, on a model
small enough to compile in seconds (marked slow); CUDA graphs only where CUDA is present.
"""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends import hf_compile as hcomp  # noqa: E402
from batchlab.backends.hf_engine import StepEngine  # noqa: E402
from batchlab.schedulers import ContinuousConfig  # noqa: E402
from batchlab.schedulers.continuous import ContinuousScheduler  # noqa: E402
from tests.backends.test_hf_engine import MIX, make, reference, step_by_hand  # noqa: E402


def test_buckets_are_powers_of_two_at_or_above():
    assert [hcomp.bucket(n) for n in (1, 2, 3, 4, 5, 16, 17, 64)] == [1, 2, 4, 4, 8, 16, 32, 64]
    assert hcomp.bucket(3, smallest=64) == 64


def eager_but_bucketed(engine: StepEngine) -> StepEngine:
    """The engine's compiled-decode path (padding, windows) with the eager pass underneath."""
    engine.decode = engine._eager
    return engine


@pytest.mark.parametrize("windows", [False, True])
def test_padded_decode_passes_match_generate_token_for_token(lm, windows):
    reqs = make(MIX, seed=5)
    engine = eager_but_bucketed(StepEngine(lm[0], lm[1]))
    padded = []
    real = hcomp.pad_rows

    def spy(plan, rows):
        padded.append(rows - len(plan.input_ids))
        real(plan, rows)
    hcomp.pad_rows, restore = spy, real
    try:
        sched = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=1000)
        step_by_hand(engine, sched, reqs, [a for *_, a in MIX], windows=windows)
    finally:
        hcomp.pad_rows = restore
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]
    assert any(p > 0 for p in padded)          # some decode passes really ran with padding rows
    assert engine.cache.slot_of == {}


def test_padding_rows_write_only_into_free_slots(lm):
    from batchlab.core.request import Request
    from batchlab.core.work import Step
    engine = StepEngine(lm[0], lm[1])
    reqs = [Request(f"p{i}", 5, 4, 0.0, index=i, prompt_token_ids=[11 + i] * 5) for i in range(3)]
    plan = engine._plan([(r, 5) for r in reqs])
    assert not hcomp.decodes_densely(plan)     # prefill rows: never padded
    for r in reqs:
        r.num_computed_tokens = 5
        r.output_token_ids.append(7)
    plan = engine._plan([(r, 1) for r in reqs])
    assert hcomp.decodes_densely(plan)
    hcomp.pad_rows(plan, 4)
    assert plan.pad == 1 and plan.input_ids.tolist()[-1] == 0 and plan.positions.tolist()[-1] == 0
    assert plan.write_slot.tolist() == [0, 1, 2, 3] and 3 not in engine.cache.slot_of.values()
    visible = (plan.single_mask[3, 0, 0] == 0).nonzero().flatten().tolist()
    assert visible == [0]                      # the padding row sees its own key only
    assert isinstance(Step([(r, 1) for r in reqs]), Step)


@pytest.mark.slow
def test_compiled_decode_matches_eager_tokens_and_counts_its_graphs():
    """torch.compile on a 2-layer random Llama (float64): the same tokens as eager through
    prefills, padded decode passes and decode windows; graphs are few (rows, slots and context
    are dynamic past one row), and a second run of the same buckets compiles nothing new."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval().to(torch.float64)

    def run(compile: bool, seed: int):
        engine = StepEngine(model, compile=compile)
        reqs = make(MIX, vocab=300, seed=seed)
        sched = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=1000)
        step_by_hand(engine, sched, reqs, [a for *_, a in MIX], windows=True)
        return [r.output_token_ids for r in reqs], engine
    eager, _ = run(False, 6)
    compiled, engine = run(True, 6)
    assert compiled == eager
    first = engine.decode.compiles
    assert 1 <= first <= 3                   # one graph for 1 row, one for the other buckets (+ slack)
    again = make(MIX, vocab=300, seed=7)
    step_by_hand(engine, ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=1000),
                 again, [a for *_, a in MIX], windows=True)
    assert engine.decode.compiles == first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
def test_cuda_graph_decode_matches_eager_tokens(lm):
    model, tok = lm
    model = model.to("cuda")
    try:
        eager_reqs, graph_reqs = make(MIX, seed=8), make(MIX, seed=8)
        for reqs, compile in ((eager_reqs, False), (graph_reqs, True)):
            engine = StepEngine(model, tok, compile=compile)
            sched = ContinuousScheduler(ContinuousConfig(block_size=4), num_kv_blocks=1000)
            step_by_hand(engine, sched, reqs, [a for *_, a in MIX], windows=True)
        assert [r.output_token_ids for r in graph_reqs] == [r.output_token_ids for r in eager_reqs]
        assert engine.decode.captures >= 1
    finally:
        model.to("cpu")


def test_backend_compile_validates_and_stays_out_of_identities_at_its_default():
    """Off by default and out of identities there (a key added after schema 1): results
    directories keep their digest."""
    from batchlab.errors import ConfigError
    from batchlab.run.config import load_config
    from batchlab.run.experiment import identity, point_hash
    off, on = load_config(None, ["backend.kind=hf"]), load_config(None, ["backend.kind=hf", "backend.compile=true"])
    assert off.backend.compile is False and on.backend.compile is True
    assert "compile" not in identity(off)["backend"] and identity(on)["backend"]["compile"] is True
    # the digests points had before backend.compile existed (computed at the commit before it): an
    # older results directory must keep resuming
    assert point_hash(off, "continuous") == "e6c8df704483"
    assert point_hash(load_config(None, []), "naive") == "4c1cf2454136"
    assert point_hash(on, "continuous") != point_hash(off, "continuous")
    with pytest.raises(ConfigError):
        load_config(None, ["backend.kind=hf", "backend.compile=sometimes"])
