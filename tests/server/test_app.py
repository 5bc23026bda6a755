"""`batchlab serve` over the simulator (toy preset, real time), driven by the official openai client."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from batchlab.backends.openai_client import OpenAIBackend
from batchlab.core.clock import RealClock
from batchlab.core.request import Status
from batchlab.core.traffic import TraceItem
from tests.server.conftest import wait_for


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


STRATEGIES = [("naive", ["naive.batch_size=1"]), ("dynamic", ["dynamic.max_wait_ms=5"]), ("continuous", [])]


@pytest.mark.parametrize("strategy,overrides", STRATEGIES)
def test_streaming_and_whole_completions_report_exact_usage(serve, strategy, overrides):
    with serve(strategy, overrides) as (url, _):
        c = client(url)
        whole = c.completions.create(model="toy", prompt="one two three", max_tokens=5)
        assert whole.usage.prompt_tokens == 3 and whole.usage.completion_tokens == 5
        assert whole.choices[0].finish_reason == "length" and len(whole.choices[0].text.split()) == 5

        chunks = list(c.completions.create(model="toy", prompt=[11, 12, 13, 14], max_tokens=6, stream=True,
                                           stream_options={"include_usage": True}))
        texts = [ch.choices[0].text for ch in chunks if ch.choices]
        assert len(texts) == 6 and all(texts)
        assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens == 4
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"


def test_chat_streaming_and_whole(serve):
    with serve("continuous") as (url, _):
        c = client(url)
        msgs = [{"role": "user", "content": "Summarize continuous batching."}]
        whole = c.chat.completions.create(model="local-model", messages=msgs, max_tokens=4)
        assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 4
        stream = c.chat.completions.create(model="local-model", messages=msgs, max_tokens=3, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(ch.choices[0].delta.content for ch in chunks if ch.choices).split() != []
        assert chunks[-1].usage.completion_tokens == 3


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(serve):
    with serve("continuous", max_model_len=64) as (url, _):
        c = client(url)
        with pytest.raises(openai.BadRequestError, match="must not be empty"):
            c.completions.create(model="toy", prompt="", max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="at least 1"):
            c.completions.create(model="toy", prompt="hi", max_tokens=0)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 64"):
            c.completions.create(model="toy", prompt=list(range(60)), max_tokens=10)
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            c.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
        wrong = httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": "hi", "max_tokens": "many"})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "max_tokens"
        broken = httpx.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert broken.status_code == 400 and "JSON" in broken.json()["error"]["message"]
        assert c.completions.create(model="toy", prompt="still here", max_tokens=2).usage.completion_tokens == 2
        metrics = httpx.get(url + "/metrics").text
        assert 'batchlab_requests_total{status="invalid"} 6.0' in metrics


def test_full_queue_gets_429_with_retry_after_and_disconnects_free_the_queue(serve):
    # Naive batching waits for 100 requests, so the first two wait forever: the queue is full.
    with serve("naive", ["naive.batch_size=100"], max_queue=2, flush_idle_s=None) as (url, server):
        body = {"model": "toy", "prompt": "wait here", "max_tokens": 3, "stream": True}
        with httpx.Client(timeout=10) as h:
            waiting = [h.stream("POST", url + "/v1/completions", json=body) for _ in range(2)]
            responses = [w.__enter__() for w in waiting]
            wait_for(lambda: server.queue_depth() == 2, what="two queued requests")
            over = h.post(url + "/v1/completions", json=body | {"stream": False})
            assert over.status_code == 429 and over.headers["retry-after"] == "1"
            assert over.json()["error"]["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                client(url).completions.create(model="toy", prompt="x", max_tokens=1)
            assert h.get(url + "/health").json()["queue_depth"] == 2
            for w, resp in zip(waiting, responses):
                w.__exit__(None, None, None)
        wait_for(lambda: server.queue_depth() == 0 and not server.engine.scheduler.waiting,
                 what="cancelled requests to leave the queue")
        metrics = httpx.get(url + "/metrics").text
        assert 'batchlab_requests_total{status="cancelled"} 2.0' in metrics
        assert 'batchlab_requests_total{status="rejected"} 2.0' in metrics


def test_naive_partial_batch_runs_once_arrivals_pause(serve):
    # Offline, the end of a trace flushes naive batching's last partial batch; live, a pause does.
    with serve("naive", ["naive.batch_size=100"], flush_idle_s=0.2) as (url, server):
        done = client(url).completions.create(model="toy", prompt="alone", max_tokens=3)
        assert done.usage.completion_tokens == 3
        assert not server.engine.scheduler.waiting and not server.engine.scheduler.running


@pytest.mark.parametrize("engine_thread", [False, True], ids=["loop-task", "engine-thread"])
def test_disconnect_mid_stream_cancels_a_running_request_and_frees_its_kv(serve, engine_thread):
    with serve("continuous", engine_thread=engine_thread) as (url, server):
        sched = server.engine.scheduler
        body = {"model": "toy", "prompt": "long one", "max_tokens": 3000, "stream": True}
        with httpx.Client(timeout=10) as h:
            with h.stream("POST", url + "/v1/completions", json=body) as resp:
                lines = resp.iter_lines()
                got = [next(lines) for _ in range(6)]          # a few tokens have streamed
                assert sum(line.startswith("data:") for line in got) >= 3
                assert len(sched.running) == 1
                health = h.get(url + "/health")                 # answers while the engine is busy
                assert health.status_code == 200 and health.json()["running"] == 1
        wait_for(lambda: not sched.running and sched.free_blocks == sched.num_kv_blocks,
                 what="the cancelled request's KV blocks to be freed")
        assert 'batchlab_requests_total{status="cancelled"} 1.0' in httpx.get(url + "/metrics").text


def test_metrics_report_queue_running_batches_and_latency_histograms(serve):
    with serve("dynamic", ["dynamic.max_wait_ms=5"]) as (url, _):
        c = client(url)
        for _ in range(3):
            c.completions.create(model="toy", prompt="a b", max_tokens=4)
        text = httpx.get(url + "/metrics").text
        for needle in ("batchlab_queue_depth 0.0", "batchlab_running_sequences 0.0",
                       'batchlab_requests_total{status="finished"} 3.0', "batchlab_ttft_seconds_count 3.0",
                       "batchlab_tpot_seconds_count 3.0", "batchlab_generation_tokens_total 12.0"):
            assert needle in text
        assert "batchlab_batch_size_count" in text and "batchlab_batch_size_count 0.0" not in text


def test_openai_backend_measures_our_server_end_to_end(serve):
    with serve("continuous") as (url, _):
        backend = OpenAIBackend(url + "/v1", "toy")
        trace = [TraceItem(0.005 * i, 8, 4 + i % 3) for i in range(12)]
        clock = RealClock()
        requests, t0 = clock.run(backend.run_trace(trace, clock))
        assert [r.status for r in requests] == [Status.FINISHED] * 12
        assert [r.output_len for r in requests] == [4 + i % 3 for i in range(12)]
        assert all(r.prompt_len == 8 and r.token_times[0] > r.arrival_time for r in requests)
        assert backend.point_facts(0.0, {})["send_lag_max"] >= 0
        # batchlab serve's own stamps come back with the usage report (same machine, same clock)
        for r in requests:
            t = backend.server_timing[r.request_id]
            assert r.arrival_time <= t["arrival"] <= t["first_token"] <= r.token_times[0]
            assert t["last_token"] <= r.token_times[-1]


def error_of(response, status: int) -> dict:
    """The OpenAI error object of a refusal, after checking its status and shape."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_every_refusal_is_an_openai_error_and_is_counted(serve):
    with serve("continuous", max_body_bytes=2000) as (url, _):
        as_json = {"content-type": "application/json"}

        def chunked():
            for _ in range(50):
                yield b"x" * 1000
        assert error_of(httpx.get(url + "/v1/nothing"), 404)["code"] == "unknown_url"
        wrong_method = httpx.delete(url + "/v1/completions")
        assert error_of(wrong_method, 405)["code"] == "method_not_allowed" and wrong_method.headers["allow"] == "POST"
        assert "GET" in error_of(httpx.post(url + "/health"), 405)["message"]
        assert "not valid JSON" in error_of(httpx.post(url + "/v1/completions", content=b"{not json", headers=as_json),
                                            400)["message"]
        assert "Content-Type" in error_of(httpx.post(url + "/v1/completions", content=b'{"model": "toy"}'), 400)["message"]
        assert "JSON object" in error_of(httpx.post(url + "/v1/completions", json=[1, 2]), 400)["message"]
        big = {"model": "toy", "prompt": "word " * 1000}
        assert error_of(httpx.post(url + "/v1/completions", json=big), 413)["code"] == "request_too_large"
        assert error_of(httpx.post(url + "/v1/completions", content=chunked(), headers=as_json), 413)["code"] \
            == "request_too_large"
        assert httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": "small", "max_tokens": 1}).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        for needle in ('batchlab_refusals_total{code="404"} 1.0', 'batchlab_refusals_total{code="405"} 2.0',
                       'batchlab_refusals_total{code="400"} 3.0', 'batchlab_refusals_total{code="413"} 2.0',
                       'batchlab_requests_total{status="invalid"} 8.0', 'batchlab_requests_total{status="finished"} 1.0'):
            assert needle in metrics


def test_prompt_token_ids_outside_the_vocabulary_are_refused_on_the_simulator(serve):
    with serve("continuous") as (url, _):                # preset toy: a 32000-token vocabulary
        for prompt in ([-1, 5], [10**12], [2**70], [[32000]], [5, 32000]):
            error = error_of(httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": prompt}), 400)
            assert error["param"] == "prompt" and "0..31999" in error["message"]
        for prompt in ([1.5], [True], ["a", 1], [[1], [2]]):
            assert error_of(httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": prompt}), 400)["param"] \
                == "prompt"
        for prompt in ([0, 31999], [[7]], [7.0]):       # 7.0 is an integer to JSON Schema, so to us
            ok = httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": prompt, "max_tokens": 2})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_both_spellings_of_max_tokens_are_checked_and_max_completion_tokens_wins(serve):
    with serve("continuous", max_model_len=64) as (url, _):
        def post(**fields):
            return httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": "a b"} | fields)
        assert error_of(post(max_tokens=0, max_completion_tokens=3), 400)["param"] == "max_tokens"
        assert error_of(post(max_tokens=3, max_completion_tokens=100), 400)["code"] == "context_length_exceeded"
        assert error_of(post(max_tokens=4.5), 400)["param"] == "max_tokens"
        assert post(max_tokens=5, max_completion_tokens=2).json()["usage"]["completion_tokens"] == 2
        assert post(max_tokens=4.0).json()["usage"]["completion_tokens"] == 4


def drain(server, grace_s: float):
    """Start the server's shutdown drain on its own event loop; returns the future."""
    return asyncio.run_coroutine_threadsafe(server.drain(server.clock.now() + grace_s), server._loop)


@pytest.mark.parametrize("engine_thread", [False, True], ids=["loop-task", "engine-thread"])
def test_drain_ends_streams_still_running_at_its_deadline_with_an_error_event(serve, engine_thread, capfd):
    with serve("continuous", engine_thread=engine_thread) as (url, server):
        body = {"model": "toy", "prompt": "long one", "max_tokens": 3000, "stream": True}
        with httpx.Client(timeout=10) as h:
            streams = [h.stream("POST", url + "/v1/completions", json=body) for _ in range(3)]
            lines = [s.__enter__().iter_lines() for s in streams]
            for it in lines:
                assert next(it).startswith("data: {")          # each is streaming
            drain(server, 0.0).result(10)
            for it, s in zip(lines, streams):
                rest = [line for line in it if line]
                assert rest[-1] == "data: [DONE]" and "shutting down" in json.loads(rest[-2][6:])["error"]["message"]
                s.__exit__(None, None, None)
            late = h.post(url + "/v1/completions", json=body | {"stream": False})
            assert error_of(late, 503)["code"] == "shutting_down"
            assert h.get(url + "/health").status_code == 503
        metrics = httpx.get(url + "/metrics").text
        assert 'batchlab_requests_total{status="failed"} 3.0' in metrics
        assert 'batchlab_refusals_total{code="503"} 1.0' in metrics
    assert "Traceback" not in capfd.readouterr().err        # the stopped engine shut down cleanly too


def test_drain_lets_requests_that_finish_before_the_deadline_finish(serve):
    with serve("continuous") as (url, server):
        body = {"model": "toy", "prompt": "short", "max_tokens": 40, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.Client(timeout=10) as h, h.stream("POST", url + "/v1/completions", json=body) as resp:
            it = resp.iter_lines()
            assert next(it).startswith("data: {")
            drained = drain(server, 30.0)
            events = [line for line in it if line]
        assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["usage"]["completion_tokens"] == 40
        assert not any('"error"' in e for e in events)
        drained.result(10)                 # returns as soon as nothing is in flight, not at the deadline
        assert server.engine.aborted is None


@pytest.mark.parametrize("path,extra,param", [
    ("completions", '"temperature": NaN', "temperature"),
    ("completions", '"temperature": Infinity', "temperature"),
    ("completions", '"temperature": -1', "temperature"),
    ("completions", '"temperature": 2.5', "temperature"),
    ("completions", '"top_p": 2', "top_p"),
    ("completions", '"top_p": -0.5', "top_p"),
    ("completions", '"stop": 5', "stop"),
    ("completions", '"stop": ["a", "b", "c", "d", "e"]', "stop"),
    ("completions", '"presence_penalty": 3', "presence_penalty"),
    ("completions", '"frequency_penalty": -2.5', "frequency_penalty"),
    ("completions", '"seed": "x"', "seed"),
    ("completions", '"logprobs": 5', "logprobs"),
    ("completions", '"echo": true', "echo"),
    ("completions", '"best_of": 2', "best_of"),
    ("chat/completions", '"logprobs": true', "logprobs"),
    ("chat/completions", '"top_logprobs": 3', "top_logprobs"),
    ("chat/completions", '"temperature": NaN', "temperature"),
])
def test_sampling_values_out_of_range_and_unsupported_options_are_refused_with_400(serve, path, extra, param):
    """OpenAI's ranges (temperature 0-2, top_p 0-1, penalties -2..2, at most 4 stop strings), finite
    numbers only; logprobs, echo and best_of are refused rather than answered with null or ignored."""
    prompt = '"prompt": "hi"' if path == "completions" else '"messages": [{"role": "user", "content": "hi"}]'
    with serve("continuous") as (url, _):
        r = httpx.post(f"{url}/v1/{path}", content=f'{{"model": "toy", {prompt}, "max_tokens": 2, {extra}}}',
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_a_field_another_endpoint_has_is_ignored_like_any_unknown_field(serve):
    """top_logprobs is a chat field; on /v1/completions it is unknown, and the schema lets unknown
    fields through (the schema fuzzer sent [false, null, 1.5] and got 400 unsupported_parameter)."""
    with serve("continuous") as (url, _):
        r = httpx.post(f"{url}/v1/completions", json={"model": "toy", "prompt": "hi", "max_tokens": 2,
                                                      "top_logprobs": [False, None, 1.5]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


def test_sampling_values_in_range_are_accepted_and_answered(serve):
    with serve("continuous") as (url, _):
        c = client(url)
        whole = c.completions.create(model="toy", prompt="hi", max_tokens=2, temperature=0, top_p=1, stop=["\n"],
                                     presence_penalty=-2, frequency_penalty=2, seed=7, logprobs=None, echo=False,
                                     best_of=1, user="someone")
        assert whole.usage.completion_tokens == 2
        chat = c.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                         temperature=2, top_p=0.5, stop="x", logprobs=False)
        assert chat.usage.completion_tokens == 2


@pytest.mark.parametrize("role", ["wizard", "", "USER"])
def test_chat_roles_outside_openais_are_refused(serve, role):
    with serve("continuous") as (url, _):
        with pytest.raises(openai.BadRequestError) as e:
            client(url).chat.completions.create(model="toy", messages=[{"role": role, "content": "hi"}], max_tokens=2)
        assert e.value.body["param"] == "messages" and "role" in e.value.body["message"]
        for ok in ("system", "developer", "user", "assistant", "tool"):
            msgs = [{"role": ok, "content": "x"}, {"role": "user", "content": "hi"}]
            assert client(url).chat.completions.create(model="toy", messages=msgs, max_tokens=1).usage.completion_tokens == 1


def test_server_info_states_the_limits_a_twin_starts_from(serve):
    """A profile of `batchlab serve` reads its limits here (the continuous section's names) rather than
    assuming them; the simulator computes on no processor of this machine, so it names no device."""
    from batchlab.backends.openai_client import server_config
    with serve("continuous", ["continuous.max_num_seqs=12", "continuous.chunk_size=64", "continuous.num_kv_blocks=500"]) as (url, _):
        stated = server_config(url + "/v1")
        assert stated == {"server": "batchlab", "device": None, "max_num_seqs": 12, "max_num_batched_tokens": 8192,
                          "block_size": 16, "num_kv_blocks": 500, "chunk_size": 64, "prefix_caching": False}
    with serve("dynamic", []) as (url, _):
        assert server_config(url + "/v1") == {"server": "batchlab", "device": None}
