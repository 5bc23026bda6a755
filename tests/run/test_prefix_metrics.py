"""Prefix-cache metrics: per-request cached/computed prompt tokens, per-point hit rates, the
report's lines, and a default run that records nothing new about a cache it did not run."""
import pandas as pd

from batchlab.core.traffic import TraceItem
from batchlab.report.report import prefix_cache_lines
from batchlab.run.config import load_config
from batchlab.run.experiment import identity, knobs, point_hash
from batchlab.run.point import run_point
from batchlab.run.schema import REQUEST_COLUMNS, request_rows
from tests.fakes import UnitStepBackend


class SharedPrefix(UnitStepBackend):
    """Prompts: one of two 8-token system prompts (by trace index), then unique tokens."""

    def prepare(self, request):
        system = list(range(100 * (request.index % 2), 100 * (request.index % 2) + 8))
        request.prompt_token_ids = system + [1000 + request.index] * (request.prompt_len - 8)


ON = ["traffic.warmup_s=0", "continuous.num_kv_blocks=1000", "continuous.block_size=4", "continuous.prefix_caching=true"]
TRACE = [TraceItem(float(i), 10, 2) for i in range(6)]    # one at a time: each finishes before the next


def test_hit_rates_per_point_and_cached_vs_computed_tokens_per_request():
    cfg = load_config(None, ON)
    res = run_point(cfg, "continuous", 1.0, 0, SharedPrefix(), trace=TRACE)
    assert [r.num_cached_tokens for r in res.requests] == [0, 0, 8, 8, 8, 8]
    s = res.summary
    assert s["cached_prompt_tokens"] == 32 and s["computed_prompt_tokens"] == 60 - 32
    assert s["prefix_hit_rate_tokens"] == 32 / 60
    assert s["prefix_hit_rate_blocks"] == 8 / 12                # 2 full blocks of 4 per 10-token prompt
    rows = request_rows(cfg, "continuous", 1.0, 0, res.requests, "m")
    assert REQUEST_COLUMNS[-5:-3] == ["cached_prompt_tokens", "computed_prompt_tokens"]
    assert [(r["cached_prompt_tokens"], r["computed_prompt_tokens"]) for r in rows][1:3] == [(0, 10), (8, 2)]


def test_without_prefix_caching_the_summary_has_no_cache_columns_and_the_config_reads_as_before():
    off = load_config(None, ON[:-1])
    res = run_point(off, "continuous", 1.0, 0, SharedPrefix(), trace=TRACE)
    assert not any(k.startswith("prefix_") for k in res.summary)
    assert all(r.num_cached_tokens == 0 for r in res.requests)
    # the key is left out while at its default: knobs, point hashes and identities stay as they were
    assert "continuous.prefix_caching" not in knobs(off, "continuous")
    assert "prefix_caching" not in identity(off)["continuous"]
    on = load_config(None, ON)
    assert knobs(on, "continuous")["continuous.prefix_caching"] is True
    assert point_hash(on, "continuous") != point_hash(off, "continuous")


def test_the_report_writes_one_line_per_point_that_ran_a_cache():
    summary = pd.DataFrame([
        {"strategy": "continuous", "rate": 4.0, "repeat": 0, "prefix_hit_rate_tokens": 0.75,
         "prefix_hit_rate_blocks": 0.8, "cached_prompt_tokens": 3000, "computed_prompt_tokens": 1000},
        {"strategy": "dynamic", "rate": 4.0, "repeat": 0, "prefix_hit_rate_tokens": float("nan"),
         "prefix_hit_rate_blocks": float("nan"), "cached_prompt_tokens": float("nan"), "computed_prompt_tokens": float("nan")}])
    lines = prefix_cache_lines(summary)
    points = [ln for ln in lines if ln.startswith("- ")]
    assert points == ["- 4 req/s, continuous, repeat 0: 75.0% of prompt tokens from the cache (80.0% of full "
                      "blocks); prefill computed 1,000 tokens, skipped 3,000"]
    assert prefix_cache_lines(summary.drop(columns=[c for c in summary if c.startswith(("prefix", "cached", "computed"))])) == []


def test_the_cache_aware_router_runs_from_the_config_and_keeps_each_prefix_on_one_replica():
    trace = [TraceItem(0.5 * i, 10, 2) for i in range(8)]
    cached = {}
    for router in ("cache_aware", "least_outstanding"):
        cfg = load_config(None, ON + ["backend.replicas=3", f"backend.router={router}"])
        res = run_point(cfg, "continuous", 1.0, 0, SharedPrefix(), trace=trace)
        assert all(r.status.value == "finished" for r in res.requests)
        cached[router] = res.summary["cached_prompt_tokens"]
    assert cached["cache_aware"] == 6 * 8                     # each system prompt computed once
    assert cached["least_outstanding"] < cached["cache_aware"]   # turns spread each prefix over replicas
