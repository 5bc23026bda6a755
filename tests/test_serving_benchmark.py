"""The serving benchmark's pure parts (benchmarks/serving.py): the bracket search on a fake
"sustains(rate)", the sustain rule on synthetic requests, the servers' alternating order and the
flag checks. Nothing here starts a server or times anything."""
import importlib.util
import sys
from pathlib import Path

import pytest

from batchlab.core.request import Request, Status
from batchlab.errors import ConfigError
from batchlab.run.config import load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("serving_bench", ROOT / "benchmarks" / "serving.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("serving_bench", mod)
    spec.loader.exec_module(mod)
    return mod


def threshold(knee_at: float, seen: list[float] | None = None):
    """A fake server: sustains every rate up to `knee_at`; records the rates it was asked."""
    def holds(rate: float) -> bool:
        if seen is not None:
            seen.append(rate)
        return rate <= knee_at
    return holds


@pytest.mark.parametrize("knee_at", [41.0, 55.0, 79.0])
def test_a_2x_bracket_settles_in_three_bisections_whichever_side_the_knee_is_on(bench, knee_at):
    found = bench.knee(threshold(knee_at), 40, 80)
    assert found["probes"][:2] == [40, 80]
    assert len(found["probes"]) == 5                       # both ends, then 3 geometric bisections
    assert found["settled"]
    assert found["sustained_rate"] <= knee_at < found["failed_rate"]
    assert found["failed_rate"] / found["sustained_rate"] - 1 <= 0.10


def test_a_bracket_below_the_knee_moves_up_doubling_then_faster(bench):
    seen: list[float] = []
    found = bench.knee(threshold(200.0, seen), 40, 80)
    assert seen[:4] == [40, 80, 160, 640]                  # x2, then x4: the ratio squares after each move
    assert found["sustained_rate"] <= 200 < found["failed_rate"] and found["settled"]


def test_a_bracket_above_the_knee_moves_down(bench):
    seen: list[float] = []
    found = bench.knee(threshold(12.0, seen), 40, 80)
    assert seen[:3] == [40, 20, 5]                         # /2, then /4
    assert found["sustained_rate"] <= 12 < found["failed_rate"] and found["settled"]


def test_a_later_repeat_from_the_previous_bracket_takes_two_points_when_the_knee_stayed(bench):
    first = bench.knee(threshold(55.0), 40, 80)
    again = bench.knee(threshold(55.0), first["sustained_rate"], first["failed_rate"])
    assert again["probes"] == [first["sustained_rate"], first["failed_rate"]]
    assert again["settled"] and again["sustained_rate"] == first["sustained_rate"]


def test_a_knee_that_moved_since_the_last_repeat_is_found_again(bench):
    found = bench.knee(threshold(70.0), 50, 54)
    assert found["sustained_rate"] <= 70 < found["failed_rate"] and found["settled"]
    assert len(found["probes"]) <= 8


def test_nothing_held_or_everything_held_is_said_and_bounded(bench):
    never = bench.knee(lambda rate: False, 40, 80, max_points=6)
    assert never["sustained_rate"] is None and not never["settled"] and len(never["probes"]) <= 6
    always = bench.knee(lambda rate: True, 40, 80, max_points=6)
    assert always["failed_rate"] is None and not always["settled"] and len(always["probes"]) == 6


def test_the_bracket_must_be_ordered(bench):
    with pytest.raises(ValueError):
        bench.knee(threshold(1.0), 80, 40)


def test_servers_alternate_order_every_repeat(bench):
    names = ["batchlab serve continuous", "vllm"]
    assert [bench.alternate(names, r) for r in range(4)] == [names, names[::-1], names, names[::-1]]
    assert bench.alternate(["a", "b", "c"], 1) == ["c", "b", "a"]


# --- the rule on synthetic points ---------------------------------------------------------------
CFG = load_config(None, ["traffic.warmup_s=2", "traffic.duration_s=30", "slo.ttft_s=2.0", "slo.tpot_s=0.05"])


def requests(rate: float, ttft, gap: float = 0.01, n_out: int = 8, horizon: float = 32.0) -> list[Request]:
    """Evenly spaced arrivals over [0, horizon); each request's first token `ttft(arrival)` after
    it arrives, then one token every `gap` seconds."""
    out = []
    for i in range(int(rate * horizon)):
        a = i / rate
        r = Request(f"r{i}", 8, n_out, a)
        first = a + ttft(a)
        r.token_times = [first + k * gap for k in range(n_out)]
        r.status = Status.FINISHED
        out.append(r)
    return out


def summary(rate: float, **over) -> dict:
    return {"rate": rate, "failed": 0, "unfinished": 0, "ttft_p99": 0.1, "tpot_p99": 0.01, "e2e_p99": 0.2} | over


def test_a_server_that_keeps_up_sustains(bench):
    v = bench.judge(summary(10.0), requests(10.0, lambda a: 0.05), "s", CFG)
    assert v["sustained"] and v["why"] == []
    assert v["served_share"] == pytest.approx(1.0, abs=0.01)
    assert v["window_tok_s"] == pytest.approx(80.0, rel=0.02)      # 10 req/s x 8 tokens
    assert abs(v["ttft_slope"]) < 1e-6


def test_a_growing_queue_fails_on_served_share_and_the_past_capacity_test(bench):
    """The queue wait grows by 0.5 s per second of arrivals: 2 s TTFT at most would still look
    fine on a p99 read too early, but the window served less and the slope shows."""
    v = bench.judge(summary(10.0), requests(10.0, lambda a: 0.5 * a), "s", CFG)
    assert not v["sustained"]
    assert any(w.startswith("served") for w in v["why"]) and any(w.startswith("queue growing") for w in v["why"])
    assert v["ttft_slope"] == pytest.approx(0.5, rel=0.01)


def test_a_slow_growing_queue_is_caught_by_the_served_share_alone(bench):
    """Slope 0.08 s/s is under the report's GROWTH (0.1 s/s), but 8 % of the window's work is late."""
    v = bench.judge(summary(10.0), requests(10.0, lambda a: 0.08 * a), "s", CFG)
    assert not v["sustained"]
    assert any(w.startswith("served") for w in v["why"]) and not any(w.startswith("queue") for w in v["why"])


def test_slo_percentiles_and_failures_are_named(bench):
    v = bench.judge(summary(10.0, ttft_p99=2.5, tpot_p99=0.06, failed=3), requests(10.0, lambda a: 0.05), "s", CFG)
    assert v["why"] == ["3 failed", "TPOT p99", "TTFT p99"]
    assert not v["sustained"]


# --- flags ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (["--bracket", "80,40"], "--bracket: need 0 < LO < HI"),
    (["--bracket", "fast"], "--bracket: want LO,HI"),
    (["--tolerance", "1.5"], "--tolerance"),
    (["--sustain-repeats", "0"], "--sustain-repeats"),
    (["--servers", "batchlab,sglang"], "unknown sglang"),
    (["--max-points", "1"], "a bracket needs two ends"),
    (["--max-points", "0", "--burst", "0"], "measures nothing"),
])
def test_bad_flags_are_one_line_errors(bench, argv, says):
    with pytest.raises(ConfigError, match=says):
        bench.parse_args(argv)


def test_main_exits_2_with_one_line(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--duration", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
