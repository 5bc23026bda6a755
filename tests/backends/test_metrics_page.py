"""Reading a server's /metrics from outside: series by name over their label sets, a histogram's
mean between two scrapes, the peak a poller keeps while a (stand-in) server's value moves, and the
engine steps a server counts (or None where it counts none)."""
from __future__ import annotations

import http.server
import math
import threading
import time

import pytest

from batchlab.backends import metrics_page as metrics

TEXT = "\n".join(["# HELP batchlab_ttft_seconds x", "# TYPE batchlab_ttft_seconds histogram",
                  'batchlab_ttft_seconds_bucket{le="0.01"} 3', 'batchlab_ttft_seconds_bucket{le="+Inf"} 100',
                  "batchlab_ttft_seconds_sum 1.5", "batchlab_ttft_seconds_count 100",
                  'vllm:num_requests_running{engine="0",model_name="tiny"} 7',
                  'vllm:num_requests_running{engine="1",model_name="tiny"} 9', ""])


def test_series_by_name_the_largest_over_label_sets():
    got = metrics.values(TEXT, ["batchlab_ttft_seconds_sum", "batchlab_ttft_seconds_count", "vllm:num_requests_running",
                                "absent"])
    assert got == {"batchlab_ttft_seconds_sum": 1.5, "batchlab_ttft_seconds_count": 100.0, "vllm:num_requests_running": 9.0}
    assert metrics.metrics_url("http://h:1/v1") == metrics.metrics_url("http://h:1/") == "http://h:1/metrics"
    assert metrics.metrics_url("http://h:1/metrics") == "http://h:1/metrics"   # a scrape URL passes through


def test_a_histograms_mean_between_two_scrapes():
    before = {"a_sum": 1.5, "a_count": 100, "b_sum": 2.0, "b_count": 10}
    after = {"a_sum": 3.0, "a_count": 200, "b_sum": 2.0, "b_count": 10}
    assert metrics.histogram_means(before, after, ["a", "b"]) == {"a": pytest.approx(0.015), "b": None}


def serving(body, status: int = 200) -> http.server.HTTPServer:
    """A stand-in /metrics answering `body()` (bytes) with `status`, on a free port."""

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_poller_keeps_each_series_peak(monkeypatch):
    values = [3, 11, 5] + [2] * 1000
    served: list[int] = []

    def body():
        served.append(1)
        return f"batchlab_running_sequences {values[len(served) - 1]}\n".encode()

    server = serving(body)
    monkeypatch.setattr(metrics, "POLL_S", 0.01)
    try:
        peaks = metrics.Peaks(f"http://127.0.0.1:{server.server_port}/v1", ["batchlab_running_sequences"])
        peaks.start()
        deadline = time.monotonic() + 30
        while len(served) < 6 and time.monotonic() < deadline:       # past the peak and well after it
            time.sleep(0.01)
        assert peaks.stop() == {"batchlab_running_sequences": 11.0}
    finally:
        server.shutdown()


VLLM_STEPS = "\n".join(["# HELP vllm:iteration_tokens_total x", "# TYPE vllm:iteration_tokens_total histogram", *(
    f'vllm:iteration_tokens_total_bucket{{engine="0",le="{le}",model_name="tiny"}} {n}'
    for le, n in [("32.0", 400), ("128.0", 400), ("2048.0", 405), ("4096.0", 412), ("+Inf", 412)]),
    'vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 412',
    'vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 9000', ""])
BATCHLAB_STEPS = 'batchlab_batch_size_bucket{le="8.0"} 70\nbatchlab_batch_size_bucket{le="+Inf"} 77\nbatchlab_batch_size_count 77\n'


@pytest.mark.parametrize(("body", "status", "steps"), [
    (VLLM_STEPS, 200, {32: 400, 128: 400, 2048: 405, 4096: 412, math.inf: 412}),   # vLLM: tokens per step
    (BATCHLAB_STEPS, 200, {8: 70, math.inf: 77}),                                  # batchlab serve: rows per step
    (TEXT, 200, None),                                                  # a /metrics without a per-step series
    ('{"detail": "Not Found"}', 404, None),                             # a server with no /metrics
])
def test_engine_steps_from_a_per_step_histogram(body, status, steps):
    server = serving(lambda: body.encode(), status)
    try:
        assert metrics.engine_steps(f"http://127.0.0.1:{server.server_port}/v1") == steps
    finally:
        server.shutdown()


def test_engine_steps_of_a_server_that_is_gone_is_none():
    server = serving(lambda: b"")
    port = server.server_port
    server.shutdown()
    server.server_close()
    assert metrics.engine_steps(f"http://127.0.0.1:{port}/v1") is None


def test_the_steps_between_two_readings_by_bucket():
    before = {32: 10.0, 128: 10.0, 2048: 12.0, math.inf: 12.0}
    after = {32: 382.0, 128: 390.0, 2048: 396.0, math.inf: 396.0}
    assert metrics.steps_between(before, after) == {
        "steps": 384.0, "step_sizes": {"32": 372.0, "128": 8.0, "2048": 4.0, "inf": 0.0}}
    assert metrics.steps_between(after, after)["steps"] == 0.0
