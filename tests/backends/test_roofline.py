import dataclasses

import pytest

from batchlab.backends.gpus import CATALOG, EFFICIENCY, gpu
from batchlab.backends.model_shape import load_shape
from batchlab.backends.roofline import kv_bytes_per_gpu, roofline
from batchlab.errors import ConfigError

L8 = load_shape("random:llama3-8b")
H100 = gpu("H100-SXM")


def test_the_catalog_is_found_without_regard_to_case_and_refuses_unknown_names():
    assert gpu("h100-sxm") is H100
    with pytest.raises(ConfigError, match="known: H100-SXM"):
        gpu("V100")
    for g in CATALOG.values():
        assert g.memory_bytes > 0 and g.mem_bw > 0 and g.flops > 0 and g.usd_per_hour > 0 and g.source


def test_one_gpu_is_the_plain_roofline():
    c = roofline(L8, H100)
    bw = 3.35e12 * EFFICIENCY.bandwidth
    assert c.weight_s == pytest.approx(L8.params * 2 / bw)
    assert c.kv_s_per_token == pytest.approx(131072 / bw)
    assert c.prefill_s_per_token == pytest.approx(2 * L8.params / (989e12 * EFFICIENCY.flops))
    assert c.overhead_s == EFFICIENCY.overhead_s          # no all-reduce on one GPU
    assert c.kv_budget_bytes == int(80e9 * 0.9 - L8.params * 2)


def test_tensor_parallelism_splits_reads_and_adds_all_reduces():
    one, two = roofline(L8, H100, 1), roofline(L8, H100, 2)
    assert two.weight_s == pytest.approx(one.weight_s / 2)
    assert two.kv_s_per_token == pytest.approx(one.kv_s_per_token / 2)
    assert two.overhead_s == pytest.approx(one.overhead_s + 2 * 32 * H100.allreduce_latency_s)
    # two all-reduces per layer, each moving 2 (tp - 1) / tp of a token's 16-bit hidden state per GPU
    per_token = 2 * 32 * (2 * (2 - 1) / 2) * 4096 * 2 / (H100.link_bw * EFFICIENCY.link)
    assert two.decode_s_per_row == pytest.approx(one.decode_s_per_row / 2 + per_token)
    assert two.kv_budget_bytes == int(2 * (80e9 * 0.9 - L8.params))


def test_a_kv_head_is_never_split():
    tiny = load_shape("random:tinyllama-1.1b")          # 4 KV heads
    assert kv_bytes_per_gpu(tiny, 8) == kv_bytes_per_gpu(tiny, 4) == tiny.kv_bytes_per_token // 4
    assert roofline(tiny, H100, 8).kv_bytes_per_token == 2 * tiny.kv_bytes_per_token    # every GPU keeps a copy


def test_weights_that_do_not_fit_are_refused_with_the_fix():
    big = load_shape("random:llama3-70b")
    with pytest.raises(ConfigError, match="raise backend.tp"):
        roofline(big, H100, 1)
    assert roofline(big, H100, 4).kv_budget_bytes > 0
    with pytest.raises(ConfigError, match="1 to 8"):
        roofline(L8, H100, 16)


def test_fp8_needs_fp8_tensor_cores():
    fp8 = dataclasses.replace(L8, dtype_bytes=1)
    assert roofline(fp8, H100).prefill_s_per_token == pytest.approx(2 * L8.params / (1979e12 * EFFICIENCY.flops))
    with pytest.raises(ConfigError, match="no FP8"):
        roofline(fp8, gpu("A100-80GB"))


def test_the_padded_batch_memory_limit():
    mistral = load_shape("random:mistral-7b")
    free = 24e9 - mistral.weight_bytes - 1.5 * 2**30
    from batchlab.backends.roofline import rows_that_fit
    assert rows_that_fit(mistral, gpu("RTX-3090"), 128, 128, 1.5 * 2**30) == int(free // (256 * 131072))
    # one long prompt in the batch pads every row to it: (2048 + 128) / (128 + 128), 8.5 times fewer rows
    long, short = (rows_that_fit(mistral, gpu("RTX-3090"), p, 128, 1.5 * 2**30) for p in (2048, 128))
    assert long == int(free // (2176 * 131072)) and short / long == pytest.approx(2176 / 256, rel=0.05)
    assert rows_that_fit(load_shape("random:llama3-70b"), gpu("RTX-3090"), 128, 128, 0) == 0
