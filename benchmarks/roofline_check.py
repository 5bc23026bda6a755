"""The catalog's roofline against published measured decode speeds, and a padded batch's memory limit.

Each published figure is a measured time per output token (or tokens/s of one stream) at a stated
concurrency on a stated GPU; the roofline predicts the same step (backends/roofline.py: the model's
shape from its bundled config, the GPU from backends/gpus.py, `tp` GPUs) with `concurrency` rows
decoding over `context` tokens each. The ratio is predicted tokens/s over measured: above 1 the
roofline is optimistic. Sources are quoted with their links; where a source leaves a setting out
(dtype, lengths), the assumption is stated beside the figure. No model runs here: it is arithmetic
on datasheet numbers, checked against other people's measurements.
Usage: python benchmarks/roofline_check.py [--json docs/results/roofline_check.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys

from batchlab.backends.gpus import EFFICIENCY, gpu
from batchlab.backends.model_shape import load_shape
from batchlab.backends.roofline import roofline, rows_that_fit

NIM = "https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance"
GPT_FAST = "https://github.com/pytorch-labs/gpt-fast"
VLLM_A100 = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"

# (label, bundled shape, gpu, tp, weight bytes, concurrency, context tokens per row, measured ms per
#  output token of one stream, source, passage, assumption)
PUBLISHED = [
    ("Llama-3.1-8B, 1x H100, NIM 1.8.0, concurrency 1", "llama3-8b", "H100-SXM", 1, "fp8", 1, 1000, 4.63, NIM,
     "Llama-3.1-8b-instruct Results, Version: 1.8.0 ... Concurrency 1 | TTFT 10.26 | ITL 4.63 | 214.56 tok/s",
     "dtype and lengths not in the table's excerpt: FP8 assumed (4.63 ms is below the 4.8 ms a BF16 8B model "
     "needs just to read its weights at the H100's peak bandwidth) and 1,000 tokens of context"),
    ("Llama-3.1-8B, 1x H100, NIM 1.8.0, concurrency 5", "llama3-8b", "H100-SXM", 1, "fp8", 5, 1000, 4.58, NIM,
     "Concurrency 5 | TTFT 16.81 | ITL 4.58 | 1076.88 tok/s", "as above"),
    ("Llama-3.1-8B, 1x H100, NIM 1.8.0, concurrency 50", "llama3-8b", "H100-SXM", 1, "fp8", 50, 1000, 5.91, NIM,
     "Concurrency 50 | TTFT 67.41 | ITL 5.91 | 8018.23 tok/s", "as above"),
    ("Llama-3.3-70B, 2x H100 TP2, FP8, NIM 1.8.0, concurrency 1", "llama3-70b", "H100-SXM", 2, "fp8", 1, 5250, 18.58, NIM,
     "2 x H100 80G / fp8 TP2 / 5000 Input Tokens / 500 Output Tokens | Concurrency 1 | TTFT 406.77 | ITL 18.58",
     "the 5,000-token prompt plus half the 500-token answer"),
    ("Llama-2-7B, 1x A100-80GB, gpt-fast, batch 1", "llama2-7b", "A100-80GB", 1, "bf16", 1, 100, 1000 / 104.9, GPT_FAST,
     "Benchmarks run on an 8xA100-80GB, power limited to 330W ... batch size=1 ... Llama-2-7B | Base (bf16) | 104.9 tok/s",
     "a 5-token prompt, so 100 tokens of context assumed (its KV read is under 1 % of the step); the GPUs were "
     "power-limited to 330 W (of 400), so an unlimited A100 may run faster"),
    ("Llama-2-7B, 2x A100-80GB TP2, gpt-fast, batch 1", "llama2-7b", "A100-80GB", 2, "bf16", 1, 100, 1000 / 168.84, GPT_FAST,
     "Llama-2-7B | 2 | 168.84 tok/s", "as above"),
    ("Llama-2-7B, 8x A100-80GB TP8, gpt-fast, batch 1", "llama2-7b", "A100-80GB", 8, "bf16", 1, 100, 1000 / 328.43, GPT_FAST,
     "Llama-2-7B | 8 | 328.43 tok/s", "as above"),
    ("Llama-3.1-8B, 1x A100-40GB, vLLM, batch 1", "llama3-8b", "A100-40GB", 1, "bf16", 1, 1088, 1000 / 75, VLLM_A100,
     "On a single NVIDIA A100 40GB, decode at one request per time runs at about 75 tokens/sec",
     "a fixed 1,024-token input and 128-token output: the prompt plus half the answer"),
]

# A padded batch's memory limit: a 24 GB RTX 3090, 128 new tokens, a 1.5 GiB reserve, every row padded to P_max.
MEMORY = [("TinyLlama-1.1B", "tinyllama-1.1b"), ("Mistral-7B", "mistral-7b")]
P_MAX = [128, 512, 2048]


def predict(shape_name: str, gpu_name: str, tp: int, dtype: str, rows: int, context: int) -> float:
    """Predicted ms per output token of one stream: one decode step of `rows` rows."""
    cost = roofline(load_shape(f"random:{shape_name}", dtype), gpu(gpu_name), tp)
    return 1e3 * cost.step_time(rows * context, 0, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    checks = []
    for label, shape, g, tp, dtype, rows, ctx, measured_ms, src, passage, assumed in PUBLISHED:
        ms = predict(shape, g, tp, dtype, rows, ctx)
        checks.append({"label": label, "shape": shape, "gpu": g, "tp": tp, "dtype": dtype, "concurrency": rows,
                       "context": ctx, "measured_ms_per_token": measured_ms, "predicted_ms_per_token": ms,
                       "ratio_predicted_over_measured_tok_s": measured_ms / ms, "source": src, "passage": passage,
                       "assumed": assumed})
        print(f"{label}: measured {1000 / measured_ms:.1f} tok/s per stream, roofline {1000 / ms:.1f} "
              f"({measured_ms / ms:.2f}x)")
    table = {name: {p: rows_that_fit(load_shape(f"random:{key}"), gpu("RTX-3090"), p, 128, 1.5 * 2**30) for p in P_MAX}
             for name, key in MEMORY}
    for name, row in table.items():
        print(f"{name} on an RTX 3090 (24 GB), 128 new tokens, 1.5 GiB reserve: "
              + ", ".join(f"P_max {p}: {b} rows" for p, b in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python " + shlex.join(sys.argv), "efficiency": dataclasses.asdict(EFFICIENCY),
                       "checks": checks, "memory_table": {"gpu": "RTX-3090", "new_tokens": 128, "reserve_gib": 1.5,
                                                          "rows": table}}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
