"""The OpenAI-compatible client backend against fake servers (httpx.MockTransport).

A real server (ours) drives it in tests/server/test_app.py; here every error path is forced."""
from __future__ import annotations

import json

import httpx
import pytest

from batchlab.backends.openai import OpenAIBackend, from_config, token_stamps
from batchlab.core.clock import RealClock
from batchlab.core.config import load_config
from batchlab.core.request import Request, Status
from batchlab.core.traffic import TraceItem
from batchlab.errors import ConfigError


def sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
                    for e in events)


def text_chunk(text):
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}]}


def usage(prompt, completion):
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}


def backend(handler, **kw) -> OpenAIBackend:
    return OpenAIBackend("http://fake/v1", "m", transport=httpx.MockTransport(handler), **kw)


def send_one(b: OpenAIBackend, r: Request) -> Request:
    clock = RealClock()

    async def main():
        b.prepare(r)
        async with b.session(1) as client:
            await b.send(r, client, clock)
    clock.run(main())
    return r


def test_streamed_chunks_are_stamped_and_counted_from_usage():
    seen = {}

    def handler(request: httpx.Request):
        seen.update(json.loads(request.content))
        seen["path"] = request.url.path
        return httpx.Response(200, content=sse(text_chunk("a"), text_chunk("b"), text_chunk("c"),
                                               usage(5, 3), b"[DONE]"))
    r = send_one(backend(handler), Request("x", 5, 3, 0.0))
    assert r.status is Status.FINISHED and r.error is None
    assert r.output_len == 3 and r.output_text == "abc"
    assert r.token_times == sorted(r.token_times)
    assert seen["path"] == "/v1/completions"
    assert seen["prompt"] == r.prompt_token_ids and len(seen["prompt"]) == 5
    assert seen["ignore_eos"] is True and seen["min_tokens"] == 3 and seen["max_tokens"] == 3
    assert seen["stream_options"] == {"include_usage": True}


def test_generation_config_mode_for_transformers_serve_sends_text_and_no_ignore_eos():
    seen = {}

    def handler(request):
        seen.update(json.loads(request.content))
        return httpx.Response(200, content=sse(text_chunk("a"), text_chunk("b"), usage(7, 2)))
    r = send_one(backend(handler, prompt_format="text", length_control="generation_config"),
                 Request("x", 4, 2, 0.0))
    assert r.status is Status.FINISHED
    assert "ignore_eos" not in seen and "min_tokens" not in seen
    assert json.loads(seen["generation_config"])["eos_token_id"] == -1
    assert isinstance(seen["prompt"], str) and r.prompt_len == 7      # exact count from usage


def test_chunks_holding_several_tokens_keep_first_and_last_stamps():
    assert token_stamps([(1.0, "ab"), (2.0, "cd")], 4) == [1.0, 2.0, 2.0, 2.0]
    assert token_stamps([(1.0, "a"), (2.0, "b"), (3.0, "")], 2) == [1.0, 2.0]
    assert token_stamps([(1.0, "a"), (2.0, "b")], 2) == [1.0, 2.0]


@pytest.mark.parametrize("status,body,expect", [
    (422, {"detail": "ignore_eos not allowed"}, "HTTP 422: ignore_eos not allowed"),
    (404, {"error": {"message": "model 'm' not found"}}, "HTTP 404: model 'm' not found"),
    (500, "boom", "HTTP 500: boom"),
])
def test_http_errors_are_recorded_on_the_request(status, body, expect):
    def handler(request):
        return (httpx.Response(status, json=body) if isinstance(body, dict)
                else httpx.Response(status, text=body))
    r = send_one(backend(handler), Request("x", 3, 2, 0.0))
    assert r.status is Status.FAILED and r.error == expect


def test_broken_stream_fails_the_request():
    async def body():
        yield sse(text_chunk("a"))
        raise httpx.RemoteProtocolError("peer closed connection")

    r = send_one(backend(lambda request: httpx.Response(200, content=body())), Request("x", 3, 2, 0.0))
    assert r.status is Status.FAILED and "RemoteProtocolError" in r.error


def test_timeout_fails_the_request():
    def handler(request):
        raise httpx.ReadTimeout("slow", request=request)
    r = send_one(backend(handler, timeout_s=1.0), Request("x", 3, 2, 0.0))
    assert r.status is Status.FAILED and r.error.startswith("timeout after 1 s")


def test_missing_usage_or_wrong_length_fails():
    r = send_one(backend(lambda q: httpx.Response(200, content=sse(text_chunk("a"), b"[DONE]"))),
                 Request("x", 3, 1, 0.0))
    assert r.status is Status.FAILED and "usage" in r.error
    r = send_one(backend(lambda q: httpx.Response(200, content=sse(text_chunk("a"), usage(3, 1)))),
                 Request("x", 3, 4, 0.0))
    assert r.status is Status.FAILED and "produced 1 tokens, expected 4" in r.error


def test_error_event_inside_the_stream_fails():
    r = send_one(backend(lambda q: httpx.Response(200, content=sse({"error": {"message": "engine died"}}))),
                 Request("x", 3, 1, 0.0))
    assert r.status is Status.FAILED and "engine died" in r.error


def test_run_trace_sends_at_planned_times_and_reports_send_lag():
    def handler(request):
        n = json.loads(request.content)["max_tokens"]
        return httpx.Response(200, content=sse(*[text_chunk("t")] * n, usage(4, n)))
    b = backend(handler)
    trace = [TraceItem(0.0, 4, 2), TraceItem(0.02, 4, 3), TraceItem(0.04, 4, 1)]
    clock = RealClock()
    requests, t0 = clock.run(b.run_trace(trace, clock))
    assert [r.status for r in requests] == [Status.FINISHED] * 3
    assert [r.arrival_time - t0 for r in requests] == pytest.approx([0.0, 0.02, 0.04])
    assert all(r.token_times[0] >= r.arrival_time for r in requests)
    meta = b.point_facts(0.0, {})
    assert len(b.send_lags) == 3 and all(lag >= 0 for lag in b.send_lags)
    assert set(meta) == {"send_lag_p50", "send_lag_p99", "send_lag_max", "send_lag_flag"}


def test_config_needs_url_and_model():
    cfg = load_config(None, ["backend.kind=openai", "strategies=[server]"])
    with pytest.raises(ConfigError, match="base_url"):
        from_config(cfg)
