"""Reading a server's /metrics from outside: series by name over their label sets, a histogram's
mean between two scrapes, and the peak a poller keeps while a (stand-in) server's value moves."""
from __future__ import annotations

import http.server
import threading
import time

import pytest

from batchlab.baselines import metrics

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


def test_the_poller_keeps_each_series_peak(monkeypatch):
    values = [3, 11, 5] + [2] * 1000
    served: list[int] = []

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"batchlab_running_sequences {values[len(served)]}\n".encode()
            served.append(1)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
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
