"""Shared by the step-engine tests (test_hf_engine.py, test_hf_prefix.py)."""
import pytest


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    """The tiny model in float64 and its tokenizer (see test_hf_engine.py for why float64)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    # NOTE: one intra-op thread: on a shared, busy CPU two threads wait on each other at every
    # op and these small passes get ~10x slower. Results do not depend on it (float64, greedy).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model, AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.set_num_threads(threads)
