"""A server's /metrics read from outside: one scrape, the peaks of some series while it is loaded
(a thread polling it), and a histogram's mean over a run from two scrapes of its _sum and _count.
The text format is parsed by prometheus_client (labels, escapes and comments that splitting a line
gets wrong); batchlab serve and vLLM both expose it.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

POLL_S = 0.5


def samples(text: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        yield from family.samples


def values(text: str, names: Iterable[str]) -> dict[str, float]:
    """The named series' values, the largest over their label sets (one per engine or model)."""
    wanted, out = set(names), {}
    for s in samples(text):
        if s.name in wanted:
            out[s.name] = max(out.get(s.name, s.value), s.value)
    return out


def metrics_url(url: str) -> str:
    """A server's /metrics from its base URL (with or without /v1), or that URL itself."""
    base = url.removesuffix("/")
    return base if base.endswith("/metrics") else base.removesuffix("/v1") + "/metrics"


def scrape(url: str, names: Iterable[str]) -> dict[str, float]:
    return values(httpx.get(metrics_url(url), timeout=5).text, names)


def histogram_means(before: dict[str, float], after: dict[str, float], names: Iterable[str]) -> dict[str, float | None]:
    """Each histogram's mean over what it observed between two scrapes (None: nothing observed)."""
    out = {}
    for name in names:
        total, count = (after[f"{name}_{k}"] - before[f"{name}_{k}"] for k in ("sum", "count"))
        out[name] = total / count if count else None
    return out


class Peaks(threading.Thread):
    """Polls a server's /metrics every POLL_S seconds while it is loaded and keeps each named
    series' maximum; a scrape that fails (the server busy or restarting) is skipped."""

    def __init__(self, url: str, names: Iterable[str]):
        super().__init__(daemon=True)
        self.url, self.names, self.peak = metrics_url(url), tuple(names), {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(POLL_S):
            try:
                now = values(httpx.get(self.url, timeout=2).text, self.names)
            except (httpx.HTTPError, ValueError):
                continue
            for name, v in now.items():
                self.peak[name] = max(self.peak.get(name, v), v)

    def stop(self) -> dict[str, float]:
        self._halt.set()
        self.join(3)
        return dict(self.peak)
