"""`batchlab serve` over the tiny Hugging Face model (real from_pretrained, real tokenizer)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import openai  # noqa: E402

from tests.server.conftest import running_server  # noqa: E402

pytestmark = pytest.mark.hf
HF = ["backend.kind=hf", "backend.model=tiny", "backend.warmup_batches=0", "dynamic.max_batch_size=4",
      "dynamic.max_wait_ms=5", "traffic.prompt_len=16", "continuous.num_kv_blocks=128"]


@pytest.fixture(scope="module")
def outputs():
    """The same prompts through dynamic and continuous batching: greedy, so the texts must agree."""
    out = {}
    for strategy in ("dynamic", "continuous"):
        with running_server(strategy, HF, names=("tiny",)) as (url, server):
            c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
            whole = c.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=6)
            chunks = list(c.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=6,
                                               stream=True, stream_options={"include_usage": True}))
            with pytest.raises(openai.BadRequestError, match="token ids must be in 0..2999"):
                c.completions.create(model="tiny", prompt=[5000], max_tokens=2)
            out[strategy] = (whole, chunks, server.max_model_len)
    return out


def test_hf_usage_is_exact_and_context_comes_from_the_model(outputs):
    for whole, chunks, context in outputs.values():
        assert whole.usage.completion_tokens == 6 and whole.usage.prompt_tokens > 0
        assert chunks[-1].usage == whole.usage
        assert context == 4096                       # the tiny model's max_position_embeddings


def test_hf_streamed_text_equals_the_whole_answer_and_strategies_agree(outputs):
    texts = {}
    for strategy, (whole, chunks, _) in outputs.items():
        streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert streamed == whole.choices[0].text != ""
        texts[strategy] = streamed
    assert texts["dynamic"] == texts["continuous"]
