"""Prometheus metrics of `batchlab serve`, one registry per server (tests run several).

Latency histograms are filled from the same per-request stamps as every batchlab report
(core/metrics.per_request), measured inside the server: they exclude the network and the
client's own delays, which a load generator adds on its side.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from batchlab.core.metrics import per_request
from batchlab.core.request import Request, Status

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queue_depth: Callable[[], float], running: Callable[[], float]):
        self.registry = reg = CollectorRegistry()
        Gauge("batchlab_queue_depth", "Requests accepted and waiting to be scheduled",
              registry=reg).set_function(queue_depth)
        Gauge("batchlab_running_sequences", "Requests in the running batch or step set",
              registry=reg).set_function(running)
        self.batch_size = Histogram("batchlab_batch_size", "Requests per batch (request-level) or per "
                                    "step (iteration-level)", buckets=BATCH_BUCKETS, registry=reg)
        self.ttft = Histogram("batchlab_ttft_seconds", "Time to first token, arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=reg)
        self.tpot = Histogram("batchlab_tpot_seconds", "Time per output token after the first",
                              buckets=TPOT_BUCKETS, registry=reg)
        self.e2e = Histogram("batchlab_e2e_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS,
                             registry=reg)
        self.queue_wait = Histogram("batchlab_queue_wait_seconds", "Arrival to first scheduled",
                                    buckets=LATENCY_BUCKETS, registry=reg)
        self.requests = Counter("batchlab_requests", "Requests by outcome: finished, failed, cancelled, "
                                "rejected (429 queue full, 503 shutting down), invalid (every other 4xx)",
                                ["status"], registry=reg)
        self.refusals = Counter("batchlab_refusals", "Requests refused before reaching the engine, by HTTP "
                                "status (400, 404, 405, 413, 429, 503): each is also counted in "
                                "batchlab_requests as invalid or rejected", ["code"], registry=reg)
        self.prompt_tokens = Counter("batchlab_prompt_tokens", "Prompt tokens of finished requests", registry=reg)
        self.generation_tokens = Counter("batchlab_generation_tokens", "Output tokens of finished requests",
                                         registry=reg)

        self.peak_memory = Gauge("batchlab_peak_memory_bytes", "Backend peak memory since start-up; the "
                                 "kind label says which number it is (e.g. peak RSS above baseline)",
                                 ["kind"], registry=reg)

    def observe_refusal(self, status: int) -> None:
        """An error answer sent before the request reached the engine (malformed, unknown path,
        too large, queue full, shutting down)."""
        self.requests.labels("rejected" if status in (429, 503) else "invalid").inc()
        self.refusals.labels(str(status)).inc()

    def observe_done(self, r: Request) -> None:
        if r.status is not Status.FINISHED:
            cancelled = (r.error or "").startswith("cancelled")
            self.requests.labels("cancelled" if cancelled else "failed").inc()
            return
        self.requests.labels("finished").inc()
        self.prompt_tokens.inc(r.prompt_len)
        self.generation_tokens.inc(r.output_len)
        m = per_request(r)
        for hist, key in ((self.ttft, "ttft"), (self.tpot, "tpot"), (self.e2e, "e2e"),
                          (self.queue_wait, "queue_wait")):
            if m[key] is not None:
                hist.observe(m[key])

    def render(self) -> bytes:
        return generate_latest(self.registry)
