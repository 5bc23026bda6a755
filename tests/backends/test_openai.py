"""The OpenAI-compatible client backend against fake servers (httpx.MockTransport).

A real server (ours) drives it in tests/server/test_app.py; here every error path is forced."""
from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from batchlab.backends import make_backend
from batchlab.backends.base import FAIL_FAST_AFTER
from batchlab.backends.openai_client import OpenAIBackend, check_server, chunk_itls, token_stamps
from batchlab.core.clock import RealClock
from batchlab.core.request import Request, Status
from batchlab.core.traffic import TraceItem
from batchlab.errors import ConfigError
from batchlab.run.config import load_config
from batchlab.run.sweep import preflight


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


def test_chunks_holding_several_tokens_keep_first_and_last_stamps_and_spread_the_rest():
    # two chunks of two tokens: TTFT and completion exact, the tokens between evenly spread (no zero gaps)
    assert token_stamps([(1.0, "ab"), (2.0, "cd")], 4) == pytest.approx([1.0, 4 / 3, 5 / 3, 2.0])
    assert token_stamps([(1.0, "ab"), (2.0, "cd"), (4.0, "ef")], 5) == pytest.approx([1.0, 1.5, 2.0, 3.0, 4.0])
    assert token_stamps([(1.0, "a"), (2.0, "b"), (3.0, "")], 2) == [1.0, 2.0]
    assert token_stamps([(1.0, "a"), (2.0, "b")], 2) == [1.0, 2.0]
    assert token_stamps([(1.0, "abc")], 3) == [1.0, 1.0, 1.0]     # the whole answer at once: nothing to spread
    assert token_stamps([], 0) == []


def test_chunk_itls_are_one_gap_per_chunk_like_vllm_bench():
    assert chunk_itls([1.0, 1.5, 3.0]) == [0.5, 1.5]
    assert chunk_itls([1.0]) == []


class CountingClock(RealClock):
    """Each reading is one tick later than the last: shows how many stamps were taken, and in what order."""

    def __init__(self):
        super().__init__()
        self.ticks = 0.0

    def now(self) -> float:
        self.ticks += 1.0
        return self.ticks


def test_events_of_one_network_read_get_a_stamp_each_in_order():
    # MockTransport hands the whole body over in one read: every event arrives together
    def handler(request):
        return httpx.Response(200, content=sse(text_chunk("a"), text_chunk("b"), text_chunk("c"),
                                               usage(5, 3), b"[DONE]"))
    b, clock, r = backend(handler), CountingClock(), Request("x", 5, 3, 0.0)

    async def main():
        b.prepare(r)
        async with b.session(1) as client:
            await b.send(r, client, clock)
    clock.run(main())
    assert r.status is Status.FINISHED
    start = b.started_at["x"]
    assert len(set(r.token_times)) == 3 and r.token_times == sorted(r.token_times)   # no shared stamps
    assert r.token_times[0] > start                  # the clock starts before the request goes out
    assert b.chunk_times["x"] == r.token_times       # one chunk per token: chunk and token stamps agree
    assert chunk_itls(b.chunk_times["x"]) == [1.0, 1.0]


def test_a_stream_split_mid_event_is_reassembled_and_stamped_per_event():
    body = sse(text_chunk("a"), text_chunk("b"), usage(2, 2), b"[DONE]")

    class Pieces(httpx.AsyncByteStream):       # three reads, cut inside an event
        async def __aiter__(self):
            for piece in (body[:10], body[10:70], body[70:]):
                yield piece

    b = backend(lambda request: httpx.Response(200, stream=Pieces()))
    r = send_one(b, Request("x", 2, 2, 0.0))
    assert r.status is Status.FINISHED and r.output_text == "ab" and r.output_len == 2
    assert r.token_times[0] < r.token_times[1]


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
        make_backend(cfg)


# -- fail fast, keys, preflight -------------------------------------------------------------------

def test_a_wrong_model_stops_the_point_after_the_first_failures_and_keeps_them():
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(404, json={"error": {"message": "The model `m` does not exist."}})
    b = backend(handler)
    trace = [TraceItem(i * 0.02, 4, 2) for i in range(60)]     # 1.2 s of arrivals; answers are instant
    clock = RealClock()
    requests, _ = clock.run(b.run_trace(trace, clock))
    assert len(requests) == 60 and all(r.status is Status.FAILED for r in requests)
    assert [r.error for r in requests[:FAIL_FAST_AFTER]] == ["HTTP 404: The model `m` does not exist."] * FAIL_FAST_AFTER
    unsent = [r for r in requests if r.error.startswith("not sent: the first 20 requests all failed with: HTTP 404")]
    assert unsent and len(calls) + len(unsent) == 60


def test_the_api_key_is_sent_but_masked_in_every_recorded_error():
    seen = {}

    def handler(request):
        seen["auth"] = request.headers["authorization"]
        return httpx.Response(401, json={"error": {"message": "Incorrect API key provided: sk-secret-987"}})
    r = send_one(backend(handler, api_key="sk-secret-987"), Request("x", 3, 2, 0.0))
    assert seen["auth"] == "Bearer sk-secret-987"
    assert r.error == "HTTP 401: Incorrect API key provided: ***"


def openai_cfg(*extra):
    return load_config(None, ["backend.kind=openai", "strategies=[server]", "backend.model=m",
                              "backend.base_url=http://fake/v1", *extra])


def test_the_key_comes_from_the_environment_only(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert make_backend(openai_cfg()).api_key == "EMPTY"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    assert make_backend(openai_cfg()).api_key == "sk-from-env"
    monkeypatch.setenv("MY_KEY", "sk-mine")
    assert make_backend(openai_cfg("backend.api_key_env=MY_KEY")).api_key == "sk-mine"
    with pytest.raises(ConfigError, match="backend.api_key_env: the environment variable NOT_SET_HERE is not set"):
        make_backend(openai_cfg("backend.api_key_env=NOT_SET_HERE"))
    assert "sk-" not in json.dumps(openai_cfg("backend.api_key_env=MY_KEY").model_dump())


def models_handler(status=200, body=None):
    def handler(request):
        assert request.url.path == "/v1/models"
        if body is None:
            return httpx.Response(status, json={"object": "list", "data": [{"id": "served-a"}, {"id": "served-b"}]})
        return httpx.Response(status, json=body) if isinstance(body, dict) else httpx.Response(status, text=body)
    return httpx.MockTransport(handler)


def test_preflight_accepts_a_served_model_and_refuses_others_naming_what_is_served():
    assert check_server("http://fake/v1", "served-b", transport=models_handler()) == []
    with pytest.raises(ConfigError) as e:
        check_server("http://fake/v1", "wrong", transport=models_handler())
    assert str(e.value) == "backend.model 'wrong' is not served at http://fake/v1; it serves: served-a, served-b"
    with pytest.raises(ConfigError, match="needs backend.model; http://fake/v1 serves: served-a, served-b"):
        check_server("http://fake/v1", None, transport=models_handler())


def test_preflight_refuses_a_refused_key_without_showing_it_and_warns_when_models_cannot_be_listed():
    with pytest.raises(ConfigError) as e:
        check_server("http://fake/v1", "m", "sk-secret-55",
                     transport=models_handler(401, {"error": {"message": "bad key sk-secret-55"}}))
    assert "HTTP 401" in str(e.value) and "OPENAI_API_KEY" in str(e.value) and "sk-secret-55" not in str(e.value)
    [w] = check_server("http://fake/v1", "m", transport=models_handler(404, "Not Found"))
    assert "HTTP 404" in w and "'m' is unchecked" in w
    [w] = check_server("http://fake/v1", "m", transport=models_handler(200, "<html>hello</html>"))
    assert "not a model list" in w


def test_preflight_on_a_server_that_does_not_answer_is_one_line():
    def slow(request):
        raise httpx.ConnectTimeout("timed out", request=request)
    with pytest.raises(ConfigError, match="http://fake/v1/models did not answer within 5 s"):
        check_server("http://fake/v1", "m", transport=httpx.MockTransport(slow))
    with socket.socket() as s:                # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError) as e:
        preflight(openai_cfg(f"backend.base_url=http://127.0.0.1:{port}/v1"))
    assert f"cannot reach http://127.0.0.1:{port}/v1/models" in str(e.value) and "\n" not in str(e.value)


def test_a_run_against_a_live_server_writes_no_key_anywhere(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from click.testing import CliRunner

    from batchlab.cli import main
    from tests.server.conftest import running_server

    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-secret-4242")
    with running_server("continuous") as (url, _):
        res = CliRunner().invoke(main, ["run", "--quiet", "--out", str(tmp_path / "out"),
                                        "--set", "backend.kind=openai", "--set", "strategies=[server]",
                                        "--set", f"backend.base_url={url}/v1", "--set", "backend.model=toy",
                                        "--set", "traffic.rates=[20]", "--set", "traffic.duration_s=0.5",
                                        "--set", "traffic.warmup_s=0", "--set", "traffic.prompt_len=4",
                                        "--set", "traffic.output_len=2"])
    assert res.exit_code == 0, res.output
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any(p.name == "requests.csv" for p in files)
    assert not [p for p in files if b"sk-live-secret-4242" in p.read_bytes()]


def test_synthetic_prompts_are_fixed_by_salt_and_index_and_share_no_prefix_across_runs():
    from batchlab.backends.openai_client import synthetic_text, synthetic_token_ids
    assert synthetic_token_ids(3, 64, salt=1) == synthetic_token_ids(3, 64, salt=1)
    a, b, c = synthetic_token_ids(3, 64, salt=1), synthetic_token_ids(4, 64, salt=1), synthetic_token_ids(3, 64, salt=2)
    assert len(a) == 64 and all(100 <= t < 1100 for t in a)
    assert a[:16] != b[:16] and a[:16] != c[:16]          # a prefix cache's first block would differ
    assert synthetic_text(3, 20, salt=1) != synthetic_text(3, 20, salt=2)
    bk = OpenAIBackend("http://fake/v1", "m", prompt_format="tokens")
    first = Request("r0", 32, 4, 0.0)
    bk.prepare(first)
    asyncio.run(bk.session(1).aclose())
    again = Request("r0", 32, 4, 0.0)
    bk.prepare(again)
    assert again.prompt_token_ids != first.prompt_token_ids   # the same trace rerun is new to the server
