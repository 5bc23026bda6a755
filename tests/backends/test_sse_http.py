"""The lean HTTP/1.1 stream client (backends/sse_http.py) through OpenAIBackend, against real
sockets: a scripted server on 127.0.0.1 writes exactly the bytes each case needs (events split
mid-line, error answers, a connection dropped mid-stream, silence), and the stub server streams
whole traces. What the httpx path is checked for in test_openai.py, the lean path is checked for here."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("httptools")

from batchlab.backends import sse_http  # noqa: E402
from batchlab.backends.openai_client import OpenAIBackend  # noqa: E402
from batchlab.baselines import stub_server  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.request import Request, Status  # noqa: E402
from batchlab.core.traffic import TraceItem  # noqa: E402


def event(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def text(t: str) -> bytes:
    return event({"choices": [{"index": 0, "text": t, "finish_reason": None}]})


def usage(p: int, c: int) -> bytes:
    return event({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict]:
    head = await reader.readuntil(b"\r\n\r\n")
    n = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return head, json.loads(await reader.readexactly(n))


def run_against(script, *requests: Request, timeout_s: float = 5.0, key: str = "EMPTY", connections: int = 1):
    """Serve `script(reader, writer, seen)` on a free port; send `requests` one after another
    through one session; returns (requests, seen, connections accepted)."""
    clock = RealClock()
    seen: list = []
    accepted = []

    async def main():
        async def handle(reader, writer):
            accepted.append(writer)
            try:
                while not reader.at_eof():
                    head, body = await read_request(reader)
                    seen.append((head, body))
                    if await script(reader, writer, body) == "close":
                        break
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        b = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "m", api_key=key, timeout_s=timeout_s,
                          max_connections=connections)
        assert b.lean
        async with server, b.session(len(requests)) as pool:
            assert isinstance(pool, sse_http.Pool)
            for r in requests:
                b.prepare(r)
                await b.send(r, pool, clock)
        return b
    b = clock.run(main())
    return b, seen, accepted


def req(i=0, out=3) -> Request:
    return Request(f"r{i}", 4, out, 0.0, index=i)


def test_events_split_across_writes_and_mid_line_are_stamped_each_in_order_and_counted_from_usage():
    async def script(reader, writer, body):
        # one write holds two events, the next event is split mid-JSON across two writes
        writer.write(HEAD + chunk(text("a") + text("b")))
        await writer.drain()
        await asyncio.sleep(0.02)
        third = text("c")
        writer.write(chunk(third[:9]))
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(chunk(third[9:]) + chunk(usage(4, 3) + event(b"[DONE]")) + b"0\r\n\r\n")
        await writer.drain()
    r = req()
    b, seen, _ = run_against(script, r)
    assert r.status is Status.FINISHED and r.output_text == "abc"
    stamps = b.chunk_times[r.request_id]
    assert len(stamps) == 3 and stamps[0] <= stamps[1] < stamps[2]
    assert stamps[2] - stamps[1] >= 0.015                 # the split event waited for its second half
    assert r.token_times == stamps
    head, body = seen[0]
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 3
    assert b.sent_at[r.request_id] <= stamps[0]


def test_a_kept_alive_connection_is_reused_for_the_next_request():
    async def script(reader, writer, body):
        writer.write(HEAD + chunk(text("x") + text("y") + usage(4, 2) + event(b"[DONE]")) + b"0\r\n\r\n")
        await writer.drain()
    rs = [req(i, 2) for i in range(3)]
    _, seen, accepted = run_against(script, *rs)
    assert all(r.status is Status.FINISHED for r in rs)
    assert len(seen) == 3 and len(accepted) == 1


@pytest.mark.parametrize("status,body,expect", [
    (429, b'{"error": {"message": "rate limit exceeded for key sk-secret-77"}}', "HTTP 429: rate limit exceeded for key ***"),
    (500, b"upstream exploded", "HTTP 500: upstream exploded"),
])
def test_an_error_answer_is_recorded_with_its_message_and_the_key_masked(status, body, expect):
    async def script(reader, writer, _):
        writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
        await writer.drain()
    r = req()
    run_against(script, r, key="sk-secret-77")
    assert r.status is Status.FAILED and r.error == expect


def test_a_connection_dropped_mid_stream_fails_the_request_and_the_next_one_gets_a_new_connection():
    calls = []

    async def script(reader, writer, body):
        calls.append(1)
        if len(calls) == 1:
            writer.write(HEAD + chunk(text("a")))
            await writer.drain()
            return "close"
        writer.write(HEAD + chunk(text("a") + text("b") + usage(4, 2) + event(b"[DONE]")) + b"0\r\n\r\n")
        await writer.drain()
    first, second = req(0, 2), req(1, 2)
    _, _, accepted = run_against(script, first, second)
    assert first.status is Status.FAILED and first.error.startswith("RemoteProtocolError: peer closed")
    assert second.status is Status.FINISHED and len(accepted) == 2


def test_silence_longer_than_the_timeout_fails_the_request_but_a_slow_stream_that_talks_does_not():
    async def silent(reader, writer, body):
        writer.write(HEAD + chunk(text("a")))
        await writer.drain()
        await asyncio.sleep(1.0)
        return "close"
    r = req()
    run_against(silent, r, timeout_s=0.3)
    assert r.status is Status.FAILED and r.error == "timeout after 0.3 s (ReadTimeout)"

    async def slow(reader, writer, body):
        writer.write(HEAD)
        for t in "abcd":                                  # 0.4 s in all, 0.1 s between reads
            await asyncio.sleep(0.1)
            writer.write(chunk(text(t)))
            await writer.drain()
        writer.write(chunk(usage(4, 4) + event(b"[DONE]")) + b"0\r\n\r\n")
        await writer.drain()
    r = req(out=4)
    run_against(slow, r, timeout_s=0.3)
    assert r.status is Status.FINISHED


def test_an_error_event_inside_the_stream_and_a_missing_usage_report_fail_the_request():
    async def error_event(reader, writer, body):
        writer.write(HEAD + chunk(text("a") + event({"error": {"message": "engine died"}})))
        await writer.drain()
        return "close"
    r = req()
    run_against(error_event, r)
    assert r.status is Status.FAILED and r.error == "ServerError: engine died"

    async def no_usage(reader, writer, body):
        writer.write(HEAD + chunk(text("a") + text("b") + text("c") + event(b"[DONE]")) + b"0\r\n\r\n")
        await writer.drain()
    r = req()
    run_against(no_usage, r)
    assert r.status is Status.FAILED and "without a usage report" in r.error


def test_a_server_that_is_not_there_is_a_connect_error():
    clock = RealClock()
    r = req()

    async def main():
        server = await asyncio.start_server(lambda *_: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        b = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2.0)
        b.prepare(r)
        async with b.session(1) as pool:
            await b.send(r, pool, clock)
    clock.run(main())
    assert r.status is Status.FAILED and r.error.startswith("ConnectError:")


def test_httpx_is_used_for_https_and_when_asked():
    assert not OpenAIBackend("https://example.invalid/v1", "m").lean
    assert not OpenAIBackend("http://127.0.0.1:1/v1", "m", client="httpx").lean
    assert OpenAIBackend("http://127.0.0.1:1/v1", "m").lean


@pytest.mark.parametrize("client", ["lean", "httpx"])
def test_a_trace_through_the_stub_server_finishes_every_request_with_exact_counts(client):
    """Both clients against the stub: every request finishes with one stamp per token, the
    stamps apart (each token stamped as it comes), and connections are reused (fewer than requests)."""
    clock = RealClock()
    trace = [TraceItem(0.002 * i, 8, 6) for i in range(40)]

    async def main():
        ready, stop = asyncio.get_running_loop().create_future(), asyncio.Event()
        task = asyncio.create_task(stub_server.serve("127.0.0.1", 0, 0.004, "stub", ready, stop))
        port = await ready
        b = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "stub", client=client, max_connections=8)
        requests, _ = await b.run_trace(trace, clock)
        stop.set()
        stepper = await task
        return b, requests, stepper
    b, requests, stepper = clock.run(main())
    assert [r.status for r in requests] == [Status.FINISHED] * 40
    assert all(len(r.token_times) == 6 and r.prompt_len == 8 for r in requests)
    gaps = [y - x for r in requests for x, y in zip(r.token_times, r.token_times[1:])]
    # stamped as they arrive, not all at once at the end (the gap itself is the machine's: under a
    # loaded run the httpx client reads a stub step's tokens late and the median gap fell below it)
    assert sorted(gaps)[len(gaps) // 2] > 0
    assert stepper.tokens == 240
