"""One point's trace sent by several processes (`loadgen.workers: N`), recorded as one.

A load generator in one Python process is bound to one core: past a few hundred streamed
requests per second its own CPU, not the server, sets the pace. Here request i goes to worker
i mod N (interleaved, so every worker sees the whole point's time span and its own share of the
rate); each worker is a fresh process (spawn: no event loop or connection is inherited) that
rebuilds the target from its spec and sends its share with the ordinary send loop.

One clock reference: the parent picks the start t0 on `time.perf_counter`, which reads the
system-wide monotonic clock (CLOCK_MONOTONIC on Linux), so the same t0 means the same instant in
every process on the machine. The offset is not assumed: each worker's clock is read against the
parent's by a ping (its reading against the midpoint of the parent's send and receive) and the
offsets are recorded with the point; they are microseconds on one machine.

On Ray (`loadgen.kind: ray`) each share is sent by a Ray actor, spread over the cluster's nodes.
An actor on the parent's node reads the same monotonic clock and its offset is taken as zero
(measured and recorded all the same); an actor on another node gets the start in its own clock
(t0 plus its measured offset), and every stamp it hands back is moved into the parent's clock by
the same offset, whose uncertainty (half the ping's round trip) is recorded with the point.

Every request is recorded exactly once: each worker hands back all of its requests, finished or
failed, with their global indices; a worker that dies (killed, crashed) loses its share's
answers, so the whole point is sent again from scratch (nothing of the failed attempt is kept)
and the restart is recorded; after MAX_ATTEMPTS the point fails in one line.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from typing import Any

from batchlab.core.clock import Clock, RealClock
from batchlab.core.config import TrafficConfig
from batchlab.core.request import Request
from batchlab.core.traffic import TraceItem
from batchlab.errors import RunFailed

READY_TIMEOUT_S = 60.0       # a worker's start (interpreter, imports) must take less than this
START_AHEAD_S = 0.25         # t0 lies this far after the last worker said it was ready, plus
PREPARE_S = 50e-6            # this much per request of the largest share (a worker builds its requests after "go")
MAX_ATTEMPTS = 2             # a point whose worker died is sent again once


@dataclass
class Share:
    """What one worker sends and what it hands back."""
    indices: list[int]
    trace: list[TraceItem]


@dataclass
class Sent:
    """One worker's outcome: its requests and the target's per-request records."""
    requests: list[Request]
    send_lags: list[float]
    records: dict[str, dict]
    cpu_s: float


class WorkerDied(RuntimeError):
    """A worker ended without handing back its share."""


def shares(trace: list[TraceItem], n: int) -> list[Share]:
    """Request i to worker i mod n."""
    return [Share(list(range(w, len(trace), n)), trace[w::n]) for w in range(n)]


def _worker(conn, spec: tuple[type, dict], share: Share, traffic: TrafficConfig | None) -> None:
    """A worker process: rebuild the target, answer the clock ping, wait for t0, send, hand back."""
    cls, kwargs = spec
    target = cls(**kwargs)
    conn.send(("ready", os.getpid()))
    msg = conn.recv()
    while msg == "ping":
        conn.send(time.perf_counter())
        msg = conn.recv()
    _, t0 = msg
    conn.send(send_share(target, share, traffic, t0))
    conn.close()


def send_share(target, share: Share, traffic: TrafficConfig | None, t0: float) -> Sent:
    """One worker's share sent from `t0` (its own clock's reading) with the ordinary send loop."""
    clock = RealClock()
    cpu = time.process_time()
    requests, _ = clock.run(target.run_trace(share.trace, clock, traffic, t0=t0, indices=share.indices))
    return Sent(requests, target.send_lags, target.records(), time.process_time() - cpu)


def start_at(clock: Clock, target, trace: list[TraceItem], workers: int) -> float:
    """t0: far enough ahead for every worker to build its requests, then the target's lead."""
    return clock.now() + START_AHEAD_S + target.lead_s + PREPARE_S * -(-len(trace) // workers)


def merge(target, sent: list[Sent], facts: dict[str, Any]) -> tuple[list[Request], dict[str, Any]]:
    """Every worker's requests in index order; their send lags and records handed to `target`;
    the split's facts with the workers' CPU."""
    target.send_lags = [lag for s in sent for lag in s.send_lags]
    target.absorb([s.records for s in sent])
    requests = sorted((r for s in sent for r in s.requests), key=lambda r: r.index)
    return requests, facts | {"loadgen_cpu_s": sum(s.cpu_s for s in sent),
                              "loadgen_cpu_max_s": max(s.cpu_s for s in sent)}


def clock_offset(conn, pings: int = 5) -> float:
    """The worker's clock minus ours, from the ping with the shortest round trip."""
    best = None
    for _ in range(pings):
        t1 = time.perf_counter()
        conn.send("ping")
        tw = conn.recv()
        t2 = time.perf_counter()
        if best is None or t2 - t1 < best[0]:
            best = (t2 - t1, tw - (t1 + t2) / 2)
    return best[1]


async def run_split(target, trace: list[TraceItem], clock: Clock, traffic: TrafficConfig | None,
                    workers: int, kind: str = "local") -> tuple[list[Request], float, dict[str, Any]]:
    """Send `trace` through `workers` processes (`kind` local) or Ray actors (ray); returns every
    request (in index order), t0 and facts about the split (offsets, each worker's CPU, restarts)."""
    attempt = _attempt_ray if kind == "ray" else _attempt
    restarts = 0
    while True:
        try:
            requests, t0, facts = await attempt(target, trace, clock, traffic, workers)
            return requests, t0, facts | {"loadgen_restarts": restarts}
        except WorkerDied as e:
            restarts += 1
            if restarts >= MAX_ATTEMPTS:
                raise RunFailed(f"loadgen: {e}, in {restarts} attempts; the point is not recorded") from None
            print(f"warning: loadgen: {e}; sending the point again (nothing of that attempt is kept)", flush=True)


async def _attempt(target, trace, clock, traffic, workers):
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    try:
        for share in shares(trace, workers):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(theirs, target.worker_spec(), share, traffic), daemon=True)
            p.start()
            theirs.close()
            pipes.append(ours)
            procs.append(p)
        for conn, p in zip(pipes, procs):
            if not await asyncio.to_thread(conn.poll, READY_TIMEOUT_S):
                raise WorkerDied(f"worker {p.pid} did not start within {READY_TIMEOUT_S:g} s")
            _recv(conn, p)
        offsets = [clock_offset(conn) for conn in pipes]
        t0 = start_at(clock, target, trace, workers)
        for conn in pipes:
            conn.send(("go", t0))
        sent = [await asyncio.to_thread(_recv, conn, p) for conn, p in zip(pipes, procs)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        for conn in pipes:
            conn.close()
    requests, facts = merge(target, sent, {"loadgen_workers": workers, "loadgen_kind": "local",
                                           "loadgen_clock_offset_max_s": max(abs(o) for o in offsets)})
    return requests, t0, facts


class LoadgenActor:
    """One load generator on a Ray worker (wrapped by ray.remote in `_attempt_ray`)."""

    def __init__(self, spec: tuple[type, dict]):
        cls, kwargs = spec
        self.target = cls(**kwargs)

    def where(self) -> tuple[str, float]:
        """This actor's node and its clock's reading now."""
        import ray
        return ray.get_runtime_context().get_node_id(), time.perf_counter()

    def run(self, share: Share, traffic: TrafficConfig | None, t0: float) -> Sent:
        return send_share(self.target, share, traffic, t0)


def ray_offset(actor, ray, pings: int = 5) -> tuple[str, float, float]:
    """(the actor's node, its clock minus ours, the round trip of the ping that measured it)."""
    best = None
    for _ in range(pings):
        t1 = time.perf_counter()
        node, tw = ray.get(actor.where.remote(), timeout=READY_TIMEOUT_S)
        t2 = time.perf_counter()
        if best is None or t2 - t1 < best[2]:
            best = (node, tw - (t1 + t2) / 2, t2 - t1)
    return best


def shift(sent: Sent, by: float) -> None:
    """Move every stamp of an actor's answer by `by` seconds (into the parent's clock)."""
    if by == 0.0:
        return
    for r in sent.requests:
        r.arrival_time += by
        if r.scheduled_time is not None:
            r.scheduled_time += by
        r.token_times[:] = [t + by for t in r.token_times]
    for name in ("sent_at", "started_at"):
        sent.records[name] = {k: v + by for k, v in sent.records.get(name, {}).items()}
    sent.records["chunk_times"] = {k: [t + by for t in v] for k, v in sent.records.get("chunk_times", {}).items()}


async def _attempt_ray(target, trace, clock, traffic, workers):
    try:
        import ray
    except ImportError:
        raise RunFailed("loadgen.kind ray needs the ray extra (pip install 'batchlab[ray]')") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
    remote = ray.remote(num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD")(LoadgenActor)
    actors = [remote.remote(target.worker_spec()) for _ in range(workers)]
    here = ray.get_runtime_context().get_node_id()
    try:
        try:
            where = [ray_offset(a, ray) for a in actors]
            # NOTE: on this node the clock is the same one: a measured offset would only add its error
            offsets = [0.0 if node == here else off for node, off, _ in where]
            t0 = start_at(clock, target, trace, workers)
            refs = [a.run.remote(share, traffic, t0 + off)
                    for a, share, off in zip(actors, shares(trace, workers), offsets)]
            sent = await asyncio.to_thread(ray.get, refs)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            raise WorkerDied(f"a Ray load generator ended before handing back its share ({type(e).__name__})") from None
    finally:
        for a in actors:
            ray.kill(a)
    for s, off in zip(sent, offsets):
        shift(s, -off)
    away = [rtt / 2 for node, _, rtt in where if node != here]
    requests, facts = merge(target, sent, {
        "loadgen_workers": workers, "loadgen_kind": "ray", "loadgen_nodes": len({n for n, _, _ in where}),
        "loadgen_clock_offset_max_s": max(abs(o) for _, o, _ in where),
        "loadgen_clock_uncertainty_s": max(away, default=0.0)})
    return requests, t0, facts


def _recv(conn, p) -> Any:
    try:
        return conn.recv()
    except (EOFError, ConnectionError):
        p.join(timeout=5)
        raise WorkerDied(f"worker {p.pid} ended (exit code {p.exitcode}) before handing back its share") from None
