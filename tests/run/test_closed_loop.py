"""Closed-loop traffic (traffic.arrival: closed) through the driver, replicas, a load target and a
whole sweep: N users, each sending its next request when its previous answer ends."""
import pytest

from batchlab.backends import make_backend
from batchlab.core.request import Status
from batchlab.core.traffic import build_trace
from batchlab.errors import ConfigError
from batchlab.report.load import load_results
from batchlab.run.config import config_warnings, load_config
from batchlab.run.point import run_point
from batchlab.run.sweep import run_sweep

CLOSED = ["traffic.arrival=closed", "traffic.concurrency=[1, 4, 16, 64]", "traffic.duration_s=20",
          "traffic.warmup_s=2", "traffic.prompt_len={dist: uniform, low: 16, high: 256}",
          "traffic.output_len={dist: uniform, low: 8, high: 96}", "naive.batch_size=8", "report=false"]


def in_system_peak(requests) -> int:
    """The most requests ever in the system at once, from the stamps alone (arrival to last token
    or, failed, to arrival): what a closed loop of N users never lets exceed N."""
    events = sorted([(r.arrival_time, 1) for r in requests]
                    + [(r.token_times[-1] if r.token_times else r.arrival_time, -1) for r in requests])
    peak = now = 0
    for _, d in events:            # NOTE: a departure sorts before an arrival at the same instant
        now += d
        peak = max(peak, now)
    return peak


def users_of(requests):
    by: dict[int, list] = {}
    for r in requests:
        by.setdefault(r.session_id, []).append(r)
    return {u: sorted(rs, key=lambda r: r.arrival_time) for u, rs in by.items()}


@pytest.mark.parametrize("strategy", ["naive", "dynamic", "continuous"])
@pytest.mark.parametrize("users", [1, 16])
def test_each_user_sends_its_next_request_the_moment_its_answer_ends(strategy, users):
    cfg = load_config(None, CLOSED)
    res = run_point(cfg, strategy, float(users), 0, make_backend(cfg))
    assert all(r.status is Status.FINISHED for r in res.requests)
    by = users_of(res.requests)
    assert sorted(by) == list(range(users))
    for rs in by.values():
        assert rs[0].arrival_time == 0.0 and rs[0].request_id.endswith("-000000")
        for prev, r in zip(rs, rs[1:]):
            assert r.arrival_time == prev.completion_time           # no think time, no gap, no overlap
        # the user stopped only because its next request would have arrived after the traffic ends
        assert rs[-1].completion_time >= cfg.traffic.horizon_s
    assert in_system_peak(res.requests) == users
    assert max(r.arrival_time for r in res.requests) < cfg.traffic.horizon_s
    assert res.summary["little_L"] == pytest.approx(users, rel=0.02)   # N requests in the system, always


def test_an_open_loop_at_the_closed_loops_throughput_breaks_its_bound():
    """The check above can fail: the same throughput offered open-loop (Poisson) does put more than
    N requests in the system at times, and its arrivals do not wait for answers."""
    cfg = load_config(None, CLOSED)
    closed = run_point(cfg, "continuous", 4.0, 0, make_backend(cfg))
    rate = closed.summary["requests_per_s"]
    open_cfg = load_config(None, [c for c in CLOSED if "arrival" not in c and "concurrency" not in c]
                           + [f"traffic.rates=[{rate}]"])
    opened = run_point(open_cfg, "continuous", rate, 0, make_backend(open_cfg))
    assert in_system_peak(closed.requests) == 4 < in_system_peak(opened.requests)


@pytest.mark.parametrize("strategy", ["dynamic", "continuous"])
def test_throughput_and_p95_latency_rise_with_concurrency_on_the_simulator(strategy):
    # NOTE: a cap under 64 rows would flatten throughput from the cap on (saturated, as it should)
    cfg = load_config(None, CLOSED + ["dynamic.max_batch_size=64"])
    rows = [run_point(cfg, strategy, float(n), 0, make_backend(cfg)).summary for n in (1, 4, 16, 64)]
    tput = [s["throughput_tok_s"] for s in rows]
    p95 = [s["e2e_p95"] for s in rows]
    assert tput == sorted(tput) and tput[-1] > 4 * tput[0]
    assert p95 == sorted(p95) and p95[-1] > 2 * p95[0]


def test_a_users_requests_depend_on_the_seed_and_its_place_only():
    cfg = load_config(None, CLOSED)
    a = run_point(cfg, "continuous", 4.0, 0, make_backend(cfg))
    b = run_point(cfg, "naive", 4.0, 0, make_backend(cfg))
    la, lb = ({r.request_id: (r.prompt_len, r.max_new_tokens) for r in x.requests} for x in (a, b))
    common = la.keys() & lb.keys()
    assert len(common) > 8 and all(la[k] == lb[k] for k in common)
    other = run_point(load_config(None, CLOSED + ["traffic.seed=1"]), "continuous", 4.0, 0, make_backend(cfg))
    assert [(r.prompt_len, r.max_new_tokens) for r in other.requests][:8] != [la[r.request_id] for r in a.requests][:8]
    assert build_trace(cfg.traffic, 4.0, 1) != build_trace(cfg.traffic, 4.0, 0)     # each repeat its own


def test_closed_loop_across_replicas_holds_the_same_bound():
    cfg = load_config(None, CLOSED + ["backend.replicas=2", "backend.router=least_outstanding"])
    res = run_point(cfg, "naive", 16.0, 0, make_backend(cfg))
    assert res.requests and all(r.status is Status.FINISHED for r in res.requests)
    assert in_system_peak(res.requests) == 16
    for rs in users_of(res.requests).values():
        assert all(r.arrival_time == prev.completion_time for prev, r in zip(rs, rs[1:]))


def test_a_closed_sweep_records_user_counts_and_resumes_byte_identically(tmp_path):
    cfg = load_config(None, CLOSED + ["traffic.concurrency=[1, 8]", "traffic.duration_s=6",
                                      "strategies=[dynamic, continuous]"])
    run_sweep(cfg, tmp_path / "a")
    full = (tmp_path / "a" / "requests.csv").read_bytes()
    summary, _, _ = load_results(tmp_path / "a")
    assert sorted(set(summary["rate"])) == [1.0, 8.0]
    text = (tmp_path / "a" / "config.yaml").read_text()
    assert "concurrency:\n  - 1\n  - 8" in text or "concurrency: [1, 8]" in text
    lines = (tmp_path / "a" / "summary.csv").read_text().splitlines()
    (tmp_path / "a" / "summary.csv").write_text("\n".join(lines[:-1]) + "\n")
    (tmp_path / "a" / "requests.csv").write_bytes(full[: len(full) - 300])
    run_sweep(cfg, tmp_path / "a")
    assert (tmp_path / "a" / "requests.csv").read_bytes() == full


def test_the_report_speaks_of_users_and_checks_littles_law(tmp_path):
    from batchlab.report.report import build_report
    cfg = load_config(None, CLOSED + ["traffic.concurrency=[1, 8]", "traffic.duration_s=6", "report=true",
                                      "strategies=[naive, continuous]"])
    run_sweep(cfg, tmp_path)
    path, lines = build_report(tmp_path)
    md = path.read_text()
    assert "users" in "\n".join(lines) and "req/s" not in lines[0]
    assert "| users N | L per strategy (N expected) |" in md and "(N − 1) / (2λ)" not in md


@pytest.mark.parametrize("bad, says", [
    (["traffic.arrival=closed"], "needs traffic.concurrency"),
    (["traffic.arrival=closed", "traffic.concurrency=[4, 4]"], "listed twice"),
    (["traffic.arrival=closed", "traffic.concurrency=[0]"], "concurrency.0"),
    (["traffic.arrival=closed", "traffic.concurrency=[4]", "traffic.sessions={turns: 2}"], "sessions cannot be combined"),
    (["traffic.arrival=closed", "traffic.concurrency=[4]", "traffic.rate_step={at_s: 1, to_rate: 5}"], "rate_step"),
])
def test_bad_closed_loop_configs_get_one_line(bad, says):
    with pytest.raises(ConfigError, match=says):
        load_config(None, bad)


def test_rates_in_a_closed_loop_and_concurrency_in_an_open_one_are_named_as_ignored():
    closed = load_config(None, ["traffic.arrival=closed", "traffic.concurrency=[2]", "traffic.rates=[5]"])
    assert any("traffic.rates does not apply to arrival 'closed'" in w for w in config_warnings(closed))
    opened = load_config(None, ["traffic.concurrency=[2]"])
    assert any("traffic.concurrency does not apply" in w for w in config_warnings(opened))


def test_a_server_is_loaded_closed_loop_through_the_openai_client():
    """backend.kind openai (a load target: it sends the trace itself) closes the loop per user too:
    each user's next request goes out when its stream's last token came back."""
    pytest.importorskip("fastapi")
    from tests.server.conftest import running_server
    with running_server("continuous") as (url, _):
        cfg = load_config(None, CLOSED + ["backend.kind=openai", f"backend.base_url={url}/v1", "backend.model=toy",
                                          "strategies=[server]", "traffic.duration_s=1.5", "traffic.warmup_s=0",
                                          "traffic.output_len={dist: uniform, low: 2, high: 6}"])
        res = run_point(cfg, "server", 4.0, 0, make_backend(cfg))
    assert len(res.requests) > 8 and all(r.status is Status.FINISHED for r in res.requests)
    by = users_of(res.requests)
    assert sorted(by) == [0, 1, 2, 3]
    for rs in by.values():
        assert [r.request_id for r in rs] == [f"u{rs[0].session_id:05d}-{k:06d}" for k in range(len(rs))]
        assert all(r.arrival_time == prev.completion_time for prev, r in zip(rs, rs[1:]))
    assert in_system_peak(res.requests) == 4
    assert res.summary["little_source"] == "stamps" and res.summary["little_L"] <= 4


@pytest.mark.parametrize("strategy", ["dynamic", "continuous"])
def test_a_real_model_is_loaded_closed_loop_on_the_real_clock(tiny_model_dir, strategy):
    cfg = load_config(None, ["backend.kind=hf", f"backend.model={tiny_model_dir}", "backend.threads=1",
                             "backend.warmup_batches=0", "traffic.arrival=closed", "traffic.concurrency=[3]",
                             "traffic.duration_s=1.5", "traffic.warmup_s=0", "traffic.prompt_len=8",
                             "traffic.output_len={dist: uniform, low: 2, high: 6}", "dynamic.max_wait_ms=5"])
    res = run_point(cfg, strategy, 3.0, 0, make_backend(cfg))
    assert len(res.requests) > 6 and all(r.status is Status.FINISHED for r in res.requests)
    for rs in users_of(res.requests).values():
        assert [len(r.output_token_ids) for r in rs] == [r.max_new_tokens for r in rs]
        assert all(r.arrival_time == prev.completion_time for prev, r in zip(rs, rs[1:]))
    assert in_system_peak(res.requests) == 3
    assert res.summary["little_L"] == pytest.approx(3, rel=0.05)     # the driver counted N in the system throughout
