"""A server's /metrics read from outside: one scrape, the peaks of some series while it is loaded
(a thread polling it), a histogram's mean over a run from two scrapes of its _sum and _count, and
the engine steps a server took between two scrapes.
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
# Histograms a server observes once per engine step (vLLM: the tokens each step computed; batchlab
# serve: the rows of each step), so their _count is the steps it has taken since its start.
STEP_HISTOGRAMS = ("vllm:iteration_tokens_total", "batchlab_batch_size")


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


def engine_steps(url: str, transport: httpx.BaseTransport | None = None) -> dict[float, float] | None:
    """The engine steps a server has taken since its start, by the bucket bounds of the first of
    STEP_HISTOGRAMS it publishes (cumulative as published: the steps whose figure was at most the
    bound; `math.inf`: all of them), summed over its engines; None where it publishes none or its
    /metrics cannot be read (a count is only a reading, never a reason to fail the run around it)."""
    try:
        found: dict[str, dict[float, float]] = {}
        with httpx.Client(timeout=5, transport=transport) as client:
            text = client.get(metrics_url(url)).text
        for s in samples(text):
            name = s.name.removesuffix("_bucket")
            if name != s.name and name in STEP_HISTOGRAMS:
                le = float(s.labels["le"])
                found.setdefault(name, {})[le] = found.get(name, {}).get(le, 0.0) + s.value
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return next((found[name] for name in STEP_HISTOGRAMS if name in found), None)


def steps_between(before: dict[float, float], after: dict[float, float]) -> dict:
    """The steps taken between two `engine_steps` readings (`steps`) and how many fell in each
    bucket (`step_sizes`, keyed by its upper bound; every bucket, so the bounds are on record)."""
    bounds = sorted(after)
    cumulative = [after[b] - before.get(b, 0.0) for b in bounds]
    below = [0.0, *cumulative[:-1]]
    sizes = {f"{b:g}": c - p for b, c, p in zip(bounds, cumulative, below, strict=True)}
    return {"steps": cumulative[-1], "step_sizes": sizes}


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
