import math

import pytest

from batchlab.run.config import load_config
from batchlab.run.schema import cost_columns, summary_row


def test_a_priced_backend_adds_cost_at_the_points_throughput():
    cfg = load_config(None, ["backend.shape=random:llama3-8b", "backend.gpu=H100-SXM", "backend.tp=2",
                             "backend.replicas=3", "backend.usd_per_gpu_hour=2.5"])
    cols = cost_columns(cfg, 1800.0)
    assert cols["gpus"] == 6 and cols["usd_per_hour"] == 15.0
    assert cols["tok_s_per_gpu"] == 300.0
    assert cols["usd_per_m_tokens"] == pytest.approx(15.0 / (1800 * 3600) * 1e6)
    assert math.isnan(cost_columns(cfg, 0.0)["usd_per_m_tokens"])


def test_an_unpriced_backend_keeps_its_summary_as_it_was():
    cfg = load_config(None, [])
    assert cost_columns(cfg, 1800.0) == {}
    row = summary_row(cfg, "continuous", 1.0, 0, "m", {"throughput_tok_s": 5.0})
    assert "usd_per_m_tokens" not in row and row["throughput_tok_s"] == 5.0
