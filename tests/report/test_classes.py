"""Per-class tables, fairness over tenants and the per-class verdict, on hand-made rows."""
import math

import numpy as np
import pandas as pd
import pytest

from batchlab.core.metrics import jain_index, max_min_shares, tenant_fairness
from batchlab.report.classes import class_table, class_verdict, fairness_table

CONFIG = {"traffic": {"warmup_s": 0, "duration_s": 10,
                      "classes": [{"name": "chat", "weight": 1, "slo": {"ttft_s": 0.5}}, {"name": "batch", "weight": 1}]},
          "slo": {"ttft_s": 5.0}}


def rows(strategy, chat_ttfts, batch_ttfts, failed_batch=0):
    out = []
    for k, ttfts in (("chat", chat_ttfts), ("batch", batch_ttfts)):
        for i, t in enumerate(ttfts):
            fail = k == "batch" and i < failed_batch
            out.append({"strategy": strategy, "rate": 10.0, "repeat": 0, "class": k, "tenant": k, "warmup": 0,
                        "status": "failed" if fail else "finished", "ttft": np.nan if fail else t,
                        "tpot": 0.01, "e2e": np.nan if fail else t + 1, "arrival_time": float(i % 10),
                        "first_token_time": float(i % 10) + t, "completion_time": float(i % 10) + t + 1,
                        "prompt_len": 10, "output_len": 0 if fail else 10, "max_new_tokens": 10})
    return out


def test_class_table_uses_each_class_slo_and_counts_failures_as_infinite():
    df = pd.DataFrame(rows("continuous", [0.1] * 5 + [1.0] * 5, [2.0] * 10, failed_batch=1))
    t = class_table(df, CONFIG).set_index("class")
    assert t.loc["chat", "slo_met"] == 0.5 and t.loc["chat", "goodput"] == 0.5      # 5 of 10 within 0.5 s, per 10 s
    assert t.loc["batch", "slo_met"] == 0.9                                          # run SLO 5 s; one failed
    assert math.isinf(t.loc["batch", "ttft_p99"]) and t.loc["batch", "failed"] == 1


def test_class_verdict_names_the_class_helped_and_the_class_that_paid():
    df = pd.DataFrame(rows("continuous", [1.0] * 10, [2.0] * 10) + rows("priority", [0.1] * 10, [3.0] * 10))
    (line,) = class_verdict(class_table(df, CONFIG), ["continuous", "priority"], 10.0)
    assert "priority cut p99 TTFT of class `chat` by 90%" in line and "+50% for `batch`" in line


def test_max_min_shares_and_jain():
    assert max_min_shares([1, 10], 6) == [1, 5]
    assert max_min_shares([4, 4], 6) == [3, 3]
    assert jain_index([1, 1, 1]) == 1 and jain_index([1, 0]) == 0.5
    # a light tenant that got all it asked and a heavy one the rest: perfectly fair
    assert tenant_fairness({"light": 1.0, "heavy": 5.0}, {"light": 1.0, "heavy": 20.0}) == pytest.approx(1.0)
    # served in proportion to demand (FCFS under overload): the light tenant got less than its due
    assert tenant_fairness({"light": 0.3, "heavy": 5.7}, {"light": 1.0, "heavy": 20.0}) < 0.8


def test_fairness_table_needs_two_tenants():
    df = pd.DataFrame(rows("vtc", [0.1] * 10, [0.2] * 10))
    t = fairness_table(df, CONFIG)
    assert list(t["tenants"]) == [2] and 0.9 < t["jain"].iloc[0] <= 1.0
    assert fairness_table(df[df["tenant"] == "chat"], CONFIG).empty


def test_per_tenant_rows_hold_each_request_to_its_own_class_slo():
    df = pd.DataFrame(rows("continuous", [0.4] * 10, [2.0] * 10))
    df["tenant"] = "acme"                                  # one tenant sends both classes
    t = class_table(df, CONFIG, by="tenant").set_index("class")
    # chat within its 0.5 s, batch within the run's 5 s: every request met its own SLO
    assert list(t.index) == ["acme"] and t.loc["acme", "slo_met"] == 1.0 and t.loc["acme", "requests"] == 20
