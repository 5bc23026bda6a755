"""A baseline server's limits: from a continuous section or flags to the server's own flags."""
import pytest

from batchlab.backends.server_limits import ServerLimits, from_section
from batchlab.errors import ConfigError
from batchlab.run.config import load_config


def section(*sets):
    return load_config(None, list(sets)).continuous


def test_only_what_the_section_sets_is_passed_so_the_rest_stays_the_servers_default():
    limits, warnings = from_section(section("continuous.max_num_seqs=8", "continuous.prefix_caching=false"))
    assert limits.given() == {"max_num_seqs": 8, "prefix_caching": False} and warnings == []
    assert limits.vllm_args() == ["--max-num-seqs", "8", "--no-enable-prefix-caching"]
    assert from_section(section())[0].given() == {}


def test_a_chunk_size_turns_chunked_prefill_on_with_vllms_per_request_cap():
    limits, _ = from_section(section("continuous.chunk_size=64", "continuous.max_num_batched_tokens=512"))
    assert limits.vllm_args() == ["--max-num-batched-tokens", "512", "--enable-chunked-prefill",
                                  "--long-prefill-token-threshold", "64"]


def test_flags_replace_the_section_and_kv_space_goes_in_bytes():
    limits = from_section(section("continuous.max_num_seqs=8"))[0].merged(ServerLimits(max_num_seqs=16, kv_cache_gib=0.5))
    assert limits.vllm_args() == ["--max-num-seqs", "16", "--kv-cache-memory-bytes", str(1 << 29)]


def test_what_no_server_flag_expresses_is_warned_about():
    _, warnings = from_section(section("continuous.preemption=reserve"))
    assert warnings == ["continuous.preemption 'reserve' is batchlab's own; vLLM preempts by recompute"]


def test_transformers_serve_takes_its_three_and_refuses_the_rest():
    assert ServerLimits(block_size=32, num_kv_blocks=256).transformers_args() == ["--cb-block-size", "32", "--cb-num-blocks", "256"]
    with pytest.raises(ConfigError, match="transformers serve has no flag for max_num_seqs"):
        ServerLimits(max_num_seqs=8).transformers_args()


def test_a_chunk_size_with_chunked_prefill_off_is_refused():
    with pytest.raises(ConfigError, match="needs chunked prefill"):
        ServerLimits(chunked_prefill=False, chunk_size=64)
