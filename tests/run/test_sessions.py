"""Sessions through the driver: a closed loop per conversation on the simulator's virtual clock
(and on the tiny Hugging Face model in real time), and the results directory around it."""
import pytest

from batchlab.backends import make_backend
from batchlab.core.request import Status
from batchlab.core.traffic import build_trace
from batchlab.report.load import load_requests
from batchlab.report.turns import ttft_by_turn
from batchlab.run.config import load_config
from batchlab.run.point import run_point
from batchlab.run.sweep import run_sweep

SESSIONS = ["traffic.rates=[2]", "traffic.duration_s=40", "traffic.warmup_s=5",
            "traffic.prompt_len={dist: uniform, low: 16, high: 64}", "traffic.output_len={dist: uniform, low: 8, high: 32}",
            "traffic.sessions={turns: 4, think_s: 1.5, message_len: {dist: uniform, low: 4, high: 24}}",
            "traffic.prefix={groups: 3, tokens: 128}", "naive.batch_size=4", "report=false"]


@pytest.mark.parametrize("strategy", ["naive", "dynamic", "continuous"])
def test_each_turn_arrives_think_time_after_the_previous_answer_and_resends_it(strategy):
    cfg = load_config(None, SESSIONS)
    trace = build_trace(cfg.traffic, 2.0)
    res = run_point(cfg, strategy, 2.0, 0, make_backend(cfg), trace=trace)
    by = {(r.session_id, r.turn): r for r in res.requests}
    assert len(by) == len(res.requests) and {t for _, t in by} == {1, 2, 3, 4}
    assert all(r.status is Status.FINISHED for r in res.requests)
    assert max(r.arrival_time for r in res.requests) < cfg.traffic.horizon_s
    for (s, k), r in by.items():
        assert len(r.prompt_token_ids) == r.prompt_len and r.prefix_group == trace[s].prefix_group
        if k == 1:
            assert r.arrival_time == trace[s].arrival
            continue
        prev = by[(s, k - 1)]
        assert r.arrival_time == prev.completion_time + trace[s].session[k - 2].think_s
        assert r.prompt_token_ids[:prev.prompt_len] == prev.prompt_token_ids
        assert r.prompt_len == prev.prompt_len + prev.output_len + trace[s].session[k - 2].message[1]
    # a session stops before its 4th turn only when the next turn would arrive after the traffic ends
    last = {s: max(k for ss, k in by if ss == s) for s, _ in by}
    cut = [s for s, k in last.items() if k < 4]
    assert cut and len(cut) < len(last)
    for s in cut:
        assert by[(s, last[s])].completion_time + trace[s].session[last[s] - 1].think_s >= cfg.traffic.horizon_s
    assert abs(res.summary["little_gap"]) < 0.05       # the driver's count agrees with the stamps


def test_a_session_sweep_is_byte_identical_on_rerun_and_after_a_torn_point(tmp_path):
    cfg = load_config(None, SESSIONS + ["traffic.rates=[1, 3]"])
    run_sweep(cfg, tmp_path / "a")
    run_sweep(cfg, tmp_path / "b")
    full = (tmp_path / "a" / "requests.csv").read_bytes()
    assert full == (tmp_path / "b" / "requests.csv").read_bytes()
    summary = (tmp_path / "a" / "summary.csv").read_text().splitlines()
    (tmp_path / "a" / "summary.csv").write_text("\n".join(summary[:-1]) + "\n")
    (tmp_path / "a" / "requests.csv").write_bytes(full[: len(full) - 500])      # last point torn mid-row
    run_sweep(cfg, tmp_path / "a")
    assert (tmp_path / "a" / "requests.csv").read_bytes() == full


def test_ttft_by_turn_from_requests_csv(tmp_path):
    cfg = load_config(None, SESSIONS + ["strategies=[continuous, naive]"])
    run_sweep(cfg, tmp_path)
    rows = load_requests(tmp_path)
    table = ttft_by_turn(rows)
    assert set(table["turn"]) == {1, 2, 3, 4} and set(table["strategy"]) == {"continuous", "naive"}
    one = rows[(rows["strategy"] == "naive") & (rows["turn"] == 2) & (rows["warmup"] == 0)]
    got = table[(table["strategy"] == "naive") & (table["turn"] == 2)]
    assert got["requests"].item() == len(one) and got["ttft_p50"].item() == one["ttft"].median()
    plain = load_requests(_plain_run(tmp_path / "plain"))
    assert ttft_by_turn(plain).empty


def _plain_run(out):
    run_sweep(load_config(None, ["traffic.rates=[2]", "traffic.duration_s=5", "report=false", "strategies=[continuous]"]), out)
    return out


@pytest.mark.parametrize("strategy", ["dynamic", "continuous"])
def test_on_a_real_model_the_next_turn_resends_the_models_own_answer(tiny_model_dir, strategy):
    from batchlab.backends import make_backend
    cfg = load_config(None, ["backend.kind=hf", f"backend.model={tiny_model_dir}", "backend.threads=1",
                             "backend.warmup_batches=0", "traffic.rates=[4]", "traffic.duration_s=1.5",
                             "traffic.warmup_s=0", "traffic.prompt_len=8", "traffic.output_len=4",
                             "traffic.sessions={turns: 3, think_s: 0.01, message_len: 3}",
                             "traffic.prefix={groups: 2, tokens: 16}"])
    backend = make_backend(cfg)
    res = run_point(cfg, strategy, 4.0, 0, backend)
    by = {(r.session_id, r.turn): r for r in res.requests}
    later = [(by[(s, k - 1)], r) for (s, k), r in by.items() if k > 1]
    assert later and all(r.status is Status.FINISHED for r in res.requests)
    for prev, r in later:
        n = prev.prompt_len + prev.output_len
        assert r.prompt_token_ids[:n] == prev.prompt_token_ids + prev.output_token_ids
        assert r.arrival_time >= prev.completion_time
    vocab = backend.facts().vocab_size
    assert all(10 <= t < vocab for r in res.requests for t in r.prompt_token_ids)


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
def test_sessions_across_replicas_close_the_loop_through_the_router(router):
    cfg = load_config(None, SESSIONS + ["backend.replicas=2", f"backend.router={router}"])
    trace = build_trace(cfg.traffic, 2.0)
    runs = [run_point(cfg, "continuous", 2.0, 0, make_backend(cfg), trace=trace) for _ in range(2)]
    res = runs[0]
    by = {(r.session_id, r.turn): r for r in res.requests}
    assert max(k for _, k in by) == 4 and all(r.status is Status.FINISHED for r in res.requests)
    for (s, k), r in by.items():
        if k > 1:
            prev = by[(s, k - 1)]
            assert r.arrival_time == prev.completion_time + trace[s].session[k - 2].think_s
            assert r.prompt_token_ids[:prev.prompt_len] == prev.prompt_token_ids
    assert [(r.request_id, r.token_times) for r in runs[1].requests] == [(r.request_id, r.token_times) for r in res.requests]
    assert abs(res.summary["little_gap"]) < 0.05


def test_naive_batching_across_replicas_drains_when_only_its_own_answers_could_fill_a_batch():
    # 2 replicas, batches of 8: near the end the waiting turns can only be joined by answers
    # to the very requests that wait, so each replica must launch a partial batch.
    cfg = load_config(None, SESSIONS + ["backend.replicas=2", "backend.router=least_outstanding", "naive.batch_size=8"])
    res = run_point(cfg, "naive", 2.0, 0, make_backend(cfg))
    assert res.requests and all(r.status is Status.FINISHED for r in res.requests)
    assert max(r.turn for r in res.requests) == 4


def test_the_report_has_ttft_by_turn_for_sessions_and_nothing_for_plain_traffic(tmp_path):
    from batchlab.report.report import build_report
    from batchlab.report.turns import turn_lines
    cfg = load_config(None, SESSIONS + ["strategies=[continuous, naive]", "report=true"])
    run_sweep(cfg, tmp_path)
    rows = load_requests(tmp_path)
    md = turn_lines(rows)
    assert md[0] == "## TTFT by turn" and "| turn | continuous | naive |" in md
    table = ttft_by_turn(rows)
    first = table[(table["strategy"] == "continuous") & (table["turn"] == 1)]
    row = next(line for line in md if line.startswith("| 1 |"))
    assert f"({int(first['requests'].item())})" in row.split("|")[2]
    path, _ = build_report(tmp_path)
    assert "## TTFT by turn" in path.read_text()
    assert turn_lines(load_requests(_plain_run(tmp_path / "plain"))) == []


def test_a_session_sweep_names_its_rates_in_sessions_per_second(tmp_path):
    """traffic.rates count conversations started, each of several requests: 'req/s' would be wrong."""
    from batchlab.report.report import build_report
    cfg = load_config(None, SESSIONS + ["strategies=[continuous, naive]", "traffic.rates=[1, 3]"])
    run_sweep(cfg, tmp_path)
    path, lines = build_report(tmp_path)
    assert "sessions/s" in lines[0] and "req/s" not in lines[0]
    md = path.read_text()
    assert "### 1 sessions/s" in md and "### 1 req/s" not in md
    plain = _plain_run(tmp_path / "plain")
    _, plain_lines = build_report(plain)
    assert "sessions/s" not in "\n".join(plain_lines) and "req/s" in "\n".join(plain_lines)
