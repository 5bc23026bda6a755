"""The wire format's stream events: cut from a template per response, they must parse to exactly
the object OpenAI's shape prescribes, whatever the text holds."""
from __future__ import annotations

import json

import pytest

from batchlab.server.protocol import DONE, Chunks, sse

TEXTS = ["hello", ' "quoted" \\ back', "new\nline\ttab", "ünïcödé 漢字 🙂", "", "</script>\u2028"]


def _event(raw: bytes) -> dict:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n\n") == 1
    return json.loads(raw[6:])


@pytest.mark.parametrize("chat", [False, True])
def test_each_token_event_is_the_full_object_with_its_text_and_finish_reason(chat):
    c = Chunks("cmpl-1", "tiny", chat)
    for k, text in enumerate(TEXTS):
        finish = "length" if k == len(TEXTS) - 1 else None
        got = _event(c.delta(text, finish))
        head = {"id": "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": c.created, "model": "tiny"}
        if chat:
            delta = {"role": "assistant", "content": text} if k == 0 else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        assert got == head | {"choices": [choice]}
        assert list(got) == list(head) + ["choices"] and list(got["choices"][0]) == list(choice)


def test_a_model_name_that_needs_escaping_stays_valid_json():
    c = Chunks('id"1', 'my "model"\\x', chat=False)
    assert _event(c.delta("a", None))["model"] == 'my "model"\\x'
    assert _event(c.usage_event({"prompt_tokens": 1}))["model"] == 'my "model"\\x'


def test_usage_error_and_done_events():
    c = Chunks("cmpl-1", "tiny", chat=False)
    assert _event(c.usage_event({"completion_tokens": 3}, {"arrival": 1.5}))["batchlab_timing"] == {"arrival": 1.5}
    assert _event(c.error_event("boom"))["error"]["message"] == "boom"
    assert DONE == b"data: [DONE]\n\n" and _event(sse({"a": [1, None]})) == {"a": [1, None]}
