"""Issue 16's joint check: a Mooncake trace's hash_ids become shared prompt blocks (traffic), and
the continuous scheduler's prefix cache finds exactly the hits those ids imply (scheduler), on the
simulator through the whole sweep, as a user runs it."""
import json

import pandas as pd

from batchlab.run.config import load_config
from batchlab.run.sweep import run_sweep

# Mooncake blocks of 64 tokens, the scheduler's of 16: each Mooncake block is 4 cache blocks.
# Requests arrive 10 s apart, so each finishes before the next and nothing is evicted.
ROWS = [
    {"timestamp": 0, "input_length": 128, "output_length": 4, "hash_ids": [1, 2]},       # 8 blocks, cold
    {"timestamp": 10_000, "input_length": 192, "output_length": 4, "hash_ids": [1, 2, 3]},  # 8 of 12 cached
    {"timestamp": 20_000, "input_length": 100, "output_length": 4, "hash_ids": [1, 4]},     # 4 of 6 cached
    {"timestamp": 30_000, "input_length": 128, "output_length": 4, "hash_ids": [5, 2]},     # 0 of 8: 2 follows 5 here
]
HIT_BLOCKS, ALL_BLOCKS = 8 + 4, 8 + 12 + 6 + 8
HIT_TOKENS, ALL_TOKENS = 16 * HIT_BLOCKS, 128 + 192 + 100 + 128


def test_a_mooncake_trace_gives_exactly_the_hit_rate_its_hash_ids_imply(tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = load_config(None, ["traffic.arrival=trace", f"traffic.trace_file={trace}", "traffic.replay.block_size=64",
                             "traffic.warmup_s=0", "strategies=[continuous]", "continuous.prefix_caching=true",
                             "continuous.block_size=16", "continuous.num_kv_blocks=4096"])
    out = run_sweep(cfg, tmp_path / "out")
    summary = pd.read_csv(out / "summary.csv")
    assert summary["prefix_hit_rate_blocks"].tolist() == [HIT_BLOCKS / ALL_BLOCKS]
    assert summary["prefix_hit_rate_tokens"].tolist() == [HIT_TOKENS / ALL_TOKENS]
    rows = pd.read_csv(out / "requests.csv").sort_values("arrival_time")
    assert rows["cached_prompt_tokens"].tolist() == [0, 128, 64, 0]
    assert (rows["cached_prompt_tokens"] + rows["computed_prompt_tokens"]).tolist() == [128, 192, 100, 128]
