"""Priority, shortest-job-first and VTC: examples of each rule, then properties on random traces
(hypothesis): every request finishes, SJF's aging keeps aged requests first come first served,
VTC's service gap between backlogged tenants stays within the paper's 2U, SJF = FCFS at light load."""
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.core.clock import VirtualClock
from batchlab.core.request import Request
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import (
    ContinuousConfig,
    ContinuousScheduler,
    PriorityConfig,
    PriorityScheduler,
    SJFConfig,
    SJFScheduler,
    VTCConfig,
    VTCScheduler,
)
from batchlab.schedulers.sjf import sigma_for_error
from tests.fakes import UnitStepBackend


def req(i, prompt=4, out=4, at=0.0, priority=0, tenant=None):
    r = Request(f"R{i}", prompt, out, float(at), index=i)
    r.priority, r.tenant, r.klass = priority, tenant, tenant
    return r


def run(sched, reqs):
    clock = VirtualClock()
    clock.run(drive(sched, UnitStepBackend(), clock, Inbox(reqs)))
    return reqs


def admitted_order(reqs):
    return [r.request_id for r in sorted(reqs, key=lambda r: (r.scheduled_time, r.index))]


# --- examples -------------------------------------------------------------------------------

def test_priority_admits_the_most_urgent_first():
    s = PriorityScheduler(ContinuousConfig(max_num_seqs=1), 100)
    reqs = [req(0, priority=2), req(1, priority=0), req(2, priority=1)]
    run(s, reqs)
    assert admitted_order(reqs) == ["R1", "R2", "R0"]


def test_priority_preempts_a_less_urgent_running_request_for_a_waiting_one():
    s = PriorityScheduler(ContinuousConfig(max_num_seqs=1), 100)
    low, high = req(0, out=10, priority=5), req(1, out=2, at=2.5, priority=0)
    run(s, [low, high])
    assert low.num_preemptions == 1 and high.num_preemptions == 0
    assert high.completion_time < low.completion_time
    assert low.output_len == 10 and low.status.value == "finished"


def test_priority_without_preemption_waits_its_turn():
    s = PriorityScheduler(ContinuousConfig(max_num_seqs=1), 100, options=PriorityConfig(preempt=False))
    low, high = req(0, out=10, priority=5), req(1, out=2, at=2.5, priority=0)
    run(s, [low, high])
    assert low.num_preemptions == 0 and high.scheduled_time >= low.completion_time


def test_sjf_takes_the_shortest_predicted_output_first():
    s = SJFScheduler(ContinuousConfig(max_num_seqs=1), 100, options=SJFConfig(aging_s=1000))
    reqs = [req(0, out=30), req(1, out=5), req(2, out=12)]
    run(s, reqs)
    assert admitted_order(reqs) == ["R1", "R2", "R0"]


def test_sjf_aged_request_goes_ahead_of_shorter_younger_ones():
    s = SJFScheduler(ContinuousConfig(max_num_seqs=1), 100, options=SJFConfig(aging_s=10))
    long = req(0, out=50, at=0.0)
    running = req(1, out=12, at=0.0)
    shorts = [req(i, out=2, at=1.0 + i) for i in range(2, 8)]
    run(s, [running, long, *shorts])
    # `running` (12) starts; shorts jump `long` until it has waited 10 s, then it goes first.
    assert long.scheduled_time - long.arrival_time >= 10
    assert all(r.scheduled_time > long.scheduled_time for r in shorts if r.arrival_time < long.scheduled_time
               and r.scheduled_time >= 10)


def test_noisy_predictor_has_the_stated_mean_error():
    for error in (0.2, 0.5, 1.0):
        z = np.random.default_rng(0).standard_normal(400_000)
        measured = np.mean(np.abs(np.exp(sigma_for_error(error) * z) - 1))
        assert abs(measured - error) < 0.01 * error + 0.005


def test_noisy_predictions_are_the_same_on_every_run():
    a = SJFScheduler(ContinuousConfig(), 100, options=SJFConfig(predictor="noisy", error=0.5))
    b = SJFScheduler(ContinuousConfig(), 100, options=SJFConfig(predictor="noisy", error=0.5))
    ra, rb = [req(i, out=100) for i in range(50)], [req(i, out=100) for i in range(50)]
    pa, pb = [a.predicted(r) for r in ra], [b.predicted(r) for r in rb]
    assert pa == pb and len(set(pa)) > 10                   # deterministic, and really noisy


def test_vtc_alternates_between_equally_served_tenants():
    s = VTCScheduler(ContinuousConfig(max_num_seqs=1), 100)
    reqs = [req(i, tenant="heavy") for i in range(6)] + [req(6 + i, tenant="light") for i in range(3)]
    run(s, reqs)
    order = [r.tenant for r in sorted(reqs, key=lambda r: r.scheduled_time)]
    assert order[:6] == ["heavy", "light"] * 3             # FCFS would serve all six heavy first


def test_vtc_lifts_a_tenant_back_from_idle():
    s = VTCScheduler(ContinuousConfig(max_num_seqs=1), 100)
    s.add(req(0, tenant="a"))
    s.counter["a"] = 500.0                                   # a has been served a lot
    s.add(req(1, tenant="b"))                               # b was idle: no credit for it
    assert s.counter["b"] == 500.0


# --- properties -----------------------------------------------------------------------------

POLICIES = [
    lambda cfg, n: ContinuousScheduler(cfg, n),
    lambda cfg, n: PriorityScheduler(cfg, n),
    lambda cfg, n: SJFScheduler(cfg, n, options=SJFConfig(aging_s=5)),
    lambda cfg, n: SJFScheduler(cfg, n, options=SJFConfig(aging_s=5, predictor="noisy", error=0.8)),
    lambda cfg, n: VTCScheduler(cfg, n),
    lambda cfg, n: PriorityScheduler(cfg, n, options=PriorityConfig(preempt=False)),
]
traces = st.lists(st.tuples(st.floats(0, 30), st.integers(1, 24), st.integers(1, 24), st.integers(0, 2)),
                  min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, which=st.integers(0, len(POLICIES) - 1), seqs=st.integers(1, 6),
       blocks=st.integers(13, 40))
def test_every_policy_finishes_every_request(trace, which, seqs, blocks):
    # 13+ blocks of 4 tokens: the longest request (24 + 24 tokens) always fits alone; fewer
    # blocks than the running set needs force preemptions.
    reqs = [req(i, p, o, a, priority=k, tenant=f"t{k}") for i, (a, p, o, k) in enumerate(trace)]
    s = POLICIES[which](ContinuousConfig(max_num_seqs=seqs, block_size=4), blocks)
    run(s, reqs)
    assert all(r.status.value == "finished" and r.output_len == r.max_new_tokens for r in reqs)
    assert s.free_blocks == blocks and not s.running and not s.waiting


@settings(max_examples=60, deadline=None)
@given(trace=traces, seqs=st.integers(1, 4), aging=st.floats(1, 20))
def test_sjf_aged_requests_are_never_overtaken_by_younger_ones(trace, seqs, aging):
    """Once a request has waited aging_s, nothing that arrived after it is admitted before it:
    its wait is bounded by the cap plus the service of older requests."""
    reqs = [req(i, p, o, a) for i, (a, p, o, _) in enumerate(trace)]
    s = SJFScheduler(ContinuousConfig(max_num_seqs=seqs, preemption="reserve"), 10_000,
                     options=SJFConfig(aging_s=aging))
    run(s, reqs)
    for old in reqs:
        aged_at = old.arrival_time + aging
        for young in reqs:
            if (young.arrival_time, young.index) > (old.arrival_time, old.index) and young.scheduled_time > aged_at:
                assert (old.scheduled_time, 0) <= (young.scheduled_time, 1)


def _service(r: Request, wp: float, wq: float, t: float) -> float:
    got = wp * r.prompt_len if r.scheduled_time is not None and r.scheduled_time <= t else 0.0
    return got + wq * sum(1 for x in r.token_times if x <= t)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(per=st.lists(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 16), st.integers(1, 16)),
                             min_size=4, max_size=20), min_size=2, max_size=3),
       seqs=st.integers(1, 6), wq=st.sampled_from([1.0, 2.0]))
def test_vtc_service_gap_between_backlogged_tenants_is_within_2u(per, seqs, wq):
    wp, bs, blocks = 1.0, 4, 16
    reqs, i = [], 0
    for k, items in enumerate(per):
        for a, p, o in items:
            reqs.append(req(i, p, o, a, tenant=f"t{k}"))
            i += 1
    s = VTCScheduler(ContinuousConfig(max_num_seqs=seqs, block_size=bs, preemption="reserve"), blocks,
                     options=VTCConfig(prefill_weight=wp, decode_weight=wq))
    run(s, sorted(reqs, key=lambda r: r.arrival_time))
    u = max(wp * max(r.prompt_len for r in reqs), wq * blocks * bs)
    times = sorted({r.scheduled_time for r in reqs} | {t for r in reqs for t in r.token_times})
    tenants = sorted({r.tenant for r in reqs})
    mine = {t: [r for r in reqs if r.tenant == t] for t in tenants}
    for a in tenants:
        for b in tenants:
            if a >= b:
                continue
            stretch: list[float] = []
            for t in times + [math.inf]:
                both = t < math.inf and all(any(r.arrival_time <= t < r.scheduled_time for r in mine[x]) for x in (a, b))
                if both:
                    stretch.append(sum(_service(r, wp, wq, t) for r in mine[a]) - sum(_service(r, wp, wq, t) for r in mine[b]))
                elif stretch:
                    assert max(stretch) - min(stretch) <= 2 * u
                    stretch = []


@settings(max_examples=40, deadline=None)
@given(gaps=st.lists(st.tuples(st.integers(1, 10), st.integers(1, 10)), min_size=1, max_size=20),
       which=st.integers(1, len(POLICIES) - 1))
def test_every_policy_equals_fcfs_at_light_load(gaps, which):
    """When each request finishes before the next arrives, no queue forms and order cannot matter."""
    t, trace = 0.0, []
    for p, o in gaps:
        trace.append((t, p, o))
        t += p + o + 5                      # more than its whole service time at one unit per step
    fcfs = run(ContinuousScheduler(ContinuousConfig(), 1000), [req(i, p, o, a) for i, (a, p, o) in enumerate(trace)])
    other = run(POLICIES[which](ContinuousConfig(), 1000), [req(i, p, o, a) for i, (a, p, o) in enumerate(trace)])
    assert [r.token_times for r in fcfs] == [r.token_times for r in other]
