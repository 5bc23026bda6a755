"""One point's trace sent by several load generator processes (backends/split.py), against the
stub server on a real socket: every request recorded exactly once, in one list, whatever the
split; a worker killed mid-point makes the point be sent again, nothing of the first attempt kept."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

pytest.importorskip("httptools")

from batchlab.backends.openai_client import OpenAIBackend  # noqa: E402
from batchlab.backends.split import Sent, shares, shift  # noqa: E402
from batchlab.baselines import stub_server  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.request import Request, Status  # noqa: E402
from batchlab.core.traffic import TraceItem  # noqa: E402
from batchlab.errors import ConfigError  # noqa: E402
from batchlab.run.config import load_config  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def stub():
    """The stub server in a thread of its own (its own event loop); yields its URL."""
    loop = asyncio.new_event_loop()
    ready: list = []
    stop = threading.Event()

    async def main():
        fut, halt = loop.create_future(), asyncio.Event()
        task = asyncio.create_task(stub_server.serve("127.0.0.1", 0, 0.003, "stub", fut, halt))
        ready.append(await fut)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        halt.set()
        await task
    t = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    t.start()
    while not ready:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{ready[0]}/v1"
    stop.set()
    t.join(5)


def test_request_i_goes_to_worker_i_mod_n_and_every_request_to_exactly_one():
    trace = [TraceItem(0.01 * i, 4, 2) for i in range(10)]
    parts = shares(trace, 3)
    assert [p.indices for p in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert sorted(i for p in parts for i in p.indices) == list(range(10))
    assert parts[1].trace == [trace[1], trace[4], trace[7]]


def run_split(url: str, n: int, workers: int, rate: float = 200.0):
    trace = [TraceItem(i / rate, 6, 4) for i in range(n)]
    backend = OpenAIBackend(url, "stub")
    clock = RealClock()
    requests, t0 = clock.run(backend.run_trace(trace, clock, workers=workers))
    return backend, requests, t0


def test_two_processes_record_every_request_once_with_its_index_and_the_parent_keeps_the_records(stub):
    backend, requests, t0 = run_split(stub, 60, 2)
    assert [r.index for r in requests] == list(range(60))
    assert [r.request_id for r in requests] == [f"r{i:06d}" for i in range(60)]
    assert all(r.status is Status.FINISHED and len(r.token_times) == 4 for r in requests)
    # one clock: planned arrivals are the parent's t0 plus the trace's offsets, stamps come after
    assert all(abs(r.arrival_time - (t0 + r.index / 200.0)) < 1e-9 for r in requests)
    assert all(r.token_times[0] > r.arrival_time for r in requests)
    assert len(backend.send_lags) == 60
    assert set(backend.chunk_times) == {r.request_id for r in requests}
    facts = backend.point_facts(t0, {})
    assert facts["loadgen_workers"] == 2 and facts["loadgen_restarts"] == 0
    assert facts["loadgen_clock_offset_max_s"] < 0.01                 # one machine, one monotonic clock
    assert 0 < facts["loadgen_cpu_max_s"] <= facts["loadgen_cpu_s"] and "send_lag_p99" in facts


def test_a_worker_killed_mid_point_sends_the_point_again_and_nothing_is_duplicated(stub):
    killed: list[int] = []
    others = {p.pid for p in mp.active_children()}          # children of earlier tests are not ours to kill

    def kill_one():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not killed:
            kids = [p for p in mp.active_children() if p.pid not in others]
            if len(kids) == 2:
                time.sleep(1.5)                                        # the point is under way
                os.kill(kids[0].pid, signal.SIGKILL)
                killed.append(kids[0].pid)
            time.sleep(0.02)
    threading.Thread(target=kill_one, daemon=True).start()
    backend, requests, _ = run_split(stub, 400, 2, rate=100.0)        # 4 s of arrivals
    assert killed
    assert [r.index for r in requests] == list(range(400))
    assert all(r.status is Status.FINISHED for r in requests)
    assert backend.split_facts["loadgen_restarts"] == 1


def test_a_closed_loop_is_not_split_and_workers_on_the_simulator_earn_a_warning():
    with pytest.raises(ConfigError, match="loadgen.workers"):
        load_config(None, ["backend.kind=openai", "backend.base_url=http://127.0.0.1:1/v1", "backend.model=m",
                           "strategies=[server]", "traffic.arrival=closed", "traffic.concurrency=[2]",
                           "loadgen.workers=2"])
    from batchlab.run.config import config_warnings
    cfg = load_config(None, ["loadgen.workers=2"])
    assert any(w.startswith("loadgen.workers does not apply to backend.kind 'sim'") for w in config_warnings(cfg))
    cfg = load_config(None, ["backend.kind=openai", "backend.base_url=http://127.0.0.1:1/v1", "backend.model=m",
                             "strategies=[server]", "loadgen.kind=ray"])
    assert any(w.startswith("loadgen.kind does not apply with loadgen.workers 1") for w in config_warnings(cfg))


def test_an_actor_on_another_node_has_every_stamp_moved_into_the_parents_clock():
    r = Request("r000003", 4, 2, 105.0, index=3)
    r.scheduled_time, r.token_times = 105.5, [106.0, 106.25]
    sent = Sent([r], [0.0], {"sent_at": {"r000003": 105.1}, "started_at": {"r000003": 105.05},
                             "chunk_times": {"r000003": [106.0, 106.25]}, "server_timing": {"r000003": {"t": 7.0}}}, 0.1)
    shift(sent, -100.0)
    assert (r.arrival_time, r.scheduled_time, r.token_times) == (5.0, 5.5, [6.0, 6.25])
    assert sent.records["sent_at"]["r000003"] == pytest.approx(5.1)
    assert sent.records["started_at"]["r000003"] == pytest.approx(5.05)
    assert sent.records["chunk_times"]["r000003"] == [6.0, 6.25]
    assert sent.records["server_timing"]["r000003"] == {"t": 7.0}     # the server's own clock: untouched


def test_ray_actors_send_the_trace_and_every_request_is_recorded_once(stub, ray_local):
    trace = [TraceItem(i / 100.0, 6, 4) for i in range(80)]
    backend = OpenAIBackend(stub, "stub")
    clock = RealClock()
    requests, t0 = clock.run(backend.run_trace(trace, clock, workers=2, spread="ray"))
    assert [r.index for r in requests] == list(range(80))
    assert all(r.status is Status.FINISHED and len(r.token_times) == 4 for r in requests)
    assert all(abs(r.arrival_time - (t0 + r.index / 100.0)) < 1e-9 for r in requests)
    facts = backend.split_facts
    assert facts["loadgen_kind"] == "ray" and facts["loadgen_nodes"] == 1 and facts["loadgen_restarts"] == 0
    assert facts["loadgen_clock_uncertainty_s"] == 0.0          # one node: the same clock, no offset applied


def test_a_sweep_with_two_load_generators_writes_one_requests_csv_and_the_split_in_its_summary(stub, tmp_path):
    import csv

    from batchlab.run.sweep import run_sweep
    cfg = load_config(None, ["backend.kind=openai", f"backend.base_url={stub}", "backend.model=stub",
                             "strategies=[server]", "loadgen.workers=2", "traffic.rates=[40]",
                             "traffic.duration_s=1.5", "traffic.warmup_s=0.2", "report=false"])
    out = run_sweep(cfg, tmp_path / "r")
    rows = list(csv.DictReader(open(out / "requests.csv")))
    assert len(rows) == len({r["request_id"] for r in rows}) > 0 and {r["status"] for r in rows} == {"finished"}
    [summary] = list(csv.DictReader(open(out / "summary.csv")))
    assert summary["loadgen_workers"] == "2" and summary["loadgen_restarts"] == "0"
    assert float(summary["loadgen_cpu_max_s"]) <= float(summary["loadgen_cpu_s"])
