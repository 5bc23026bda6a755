"""The serving comparison's own parts: the flags it refuses, the servers' alternating order, where
a repeat's search starts, the report's header and what it carries over; and one server's search run
end to end against a stub server (httpx.MockTransport: nothing is started or timed)."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from batchlab.backends.openai_client import OpenAIBackend
from batchlab.baselines import compare
from batchlab.baselines.overhead import stub_reply
from batchlab.errors import ConfigError
from batchlab.run.config import load_config


def settings(**kw) -> compare.Settings:
    return compare.Settings("c.yaml", [], Path(".venv-vllm"), **kw)


@pytest.mark.parametrize("kw, parts, says", [
    (dict(bracket=(80.0, 40.0)), [], "--bracket: need 0 < LO < HI"),
    (dict(tolerance=1.5), [], "--tolerance"),
    (dict(sustain_repeats=0), [], "--sustain-repeats"),
    (dict(), ["batchlab", "sglang"], "unknown sglang"),
    (dict(max_points=1), [], "a bracket needs two ends"),
    (dict(max_points=0, burst=0), [], "measures nothing"),
    (dict(timeout=0.0), [], "--timeout"),
    (dict(overload=0.8), [], "--overload: 0 .* above 1"),
    (dict(overload=float("nan")), [], "--overload"),
    (dict(max_queue=0), [], "--max-queue: must be at least 1"),
])
def test_bad_settings_are_one_line_errors(kw, parts, says):
    with pytest.raises(ConfigError, match=says) as e:
        compare.check(settings(**kw), parts)
    assert "\n" not in str(e.value)


def test_batchlab_serve_runs_with_the_queue_bound_asked_for():
    unbounded = compare.batchlab_command("continuous", settings())
    assert unbounded[unbounded.index("--max-queue") + 1] == str(compare.UNBOUNDED_QUEUE)
    bounded = compare.batchlab_command("continuous", settings(max_queue=256))
    assert bounded[bounded.index("--max-queue") + 1] == "256" and bounded[bounded.index("--strategy") + 1] == "continuous"


def test_servers_alternate_order_every_repeat():
    names = ["batchlab serve continuous", "vllm"]
    assert [compare.alternate(names, r) for r in range(4)] == [names, names[::-1], names, names[::-1]]
    assert compare.alternate(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_a_repeat_starts_from_the_last_bracket_or_from_the_start_when_there_was_none():
    assert compare.next_bracket({"sustained_rate": 50.0, "failed_rate": 55.0}, (40, 80)) == (50.0, 55.0)
    assert compare.next_bracket({"sustained_rate": None, "failed_rate": 40.0}, (40, 80)) == (40, 80)
    assert compare.next_bracket({"error": "could not start"}, (40, 80)) == (40, 80)


def test_one_batchlab_server_per_strategy_then_the_baselines_asked_for():
    cfg = load_config(None, ["strategies=[dynamic, continuous]"])
    assert compare.server_names(cfg, ["vllm", "batchlab", "overhead"]) == [
        "batchlab serve dynamic", "batchlab serve continuous", "vllm"]


def test_the_header_states_the_rule_and_a_rerun_keeps_the_parts_it_did_not_measure(tmp_path):
    cfg = load_config(None, ["slo.ttft_s=2"])
    report = compare.header(settings(), cfg, "python benchmarks/serving.py")
    assert report["rule"] == {"served": 0.95, "growth_s_per_s": 0.1, "tolerance": 0.1, "bracket_start": [40.0, 80.0],
                              "max_points": 10, "burst": 1024, "max_queue": compare.UNBOUNDED_QUEUE}
    assert report["slo"] == {"ttft_s": 2.0} and not report["pinned"]
    out = tmp_path / "serving.json"
    compare.save(report | {"overhead": {"rate": 2.0}}, out)
    again = compare.header(settings(), cfg, "python benchmarks/serving.py --servers vllm")
    compare.carry_over(out, again, ["vllm"])
    assert again["overhead"] == {"rate": 2.0} and again["carried"]["overhead"]["command"] == "python benchmarks/serving.py"
    assert "loadgen" not in again and json.loads(out.read_text())["load_avg_1_5_15"]["after"]


def stub():
    """A short trace's config, and a client of a stub server that answers at once."""
    cfg = load_config(None, ["traffic.duration_s=1", "traffic.warmup_s=0", "traffic.prompt_len=8", "traffic.output_len=4"])
    return cfg, OpenAIBackend("http://stub/v1", "m", transport=httpx.MockTransport(stub_reply))


def test_one_servers_search_against_a_stub_keeps_every_point_with_its_verdict():
    """A stub that answers at once holds both ends of the bracket; the search stops at its cap."""
    cfg, backend = stub()
    res = compare.search_server("stub", backend, cfg, (4.0, 8.0), settings(max_points=2, burst=16, overload=0))
    assert res["probes"] == [4.0, 8.0] and [p["rate"] for p in res["points"]] == [4.0, 8.0]
    assert res["bracket_start"] == [4.0, 8.0] and res["saturated"]["requests"] == 16 and res["saturated"]["failed"] == 0
    for p in res["points"]:
        assert set(compare.POINT_KEYS) < set(p) and p["sustained"] == (p["why"] == [])
    assert res["settled"] is False


def test_past_the_knee_one_point_at_the_overload_multiple_of_the_rate_held():
    """The overload point is measured apart from the search's points, at 1.5x the rate it held."""
    cfg, backend = stub()
    res = compare.search_server("stub", backend, cfg, (4.0, 8.0), settings(max_points=2, burst=0))
    over = res["overload"]
    assert res["sustained_rate"] == 8.0 and over["rate"] == 12.0 and over["factor"] == 1.5
    assert 12.0 not in [p["rate"] for p in res["points"]] and 0 < over["served_share"] <= 1.0
    none = compare.search_server("stub", backend, cfg, (4.0, 8.0), settings(max_points=0, burst=16))
    assert "overload" not in none       # nothing searched, nothing held: no rate to multiply
