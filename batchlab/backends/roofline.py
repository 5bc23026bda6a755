"""The roofline step model of a model shape on a GPU, split over `tp` GPUs by tensor parallelism.

A decode step reads every weight once and every running sequence's KV cache; prompt tokens cost
compute. With tensor parallelism each of the tp GPUs holds 1/tp of the weights and of the KV heads
(a KV head is never split: with more GPUs than KV heads each GPU keeps a copy of one), so reads
shrink by tp, and every layer adds two all-reduces of the tokens' hidden states (after attention
and after the MLP), ring-style:

    per step   overhead + W / (tp x BW_eff) + 2 L x all-reduce latency
    per token  of context: KV bytes per GPU / BW_eff
               computed:   2 x active params / (tp x FLOP/s_eff) + 2 L x 2 (tp - 1) / tp x hidden x 2 B / link_eff

The KV budget is what the engine's share of memory leaves after the weights, on every GPU.
NOTE: a mixture of experts reads every expert's weights per step (a batch of more than a few rows
routes to nearly all of them) but computes only the active ones per token.
"""
from __future__ import annotations

import math

from batchlab.backends.cost import StepCost
from batchlab.backends.gpus import EFFICIENCY, GPU, Efficiency
from batchlab.backends.model_shape import ModelShape
from batchlab.errors import ConfigError

ROOFLINE = "roofline estimate"
ACTIVATION_BYTES = 2                # hidden states cross the link in 16 bits whatever the weights are


def kv_bytes_per_gpu(shape: ModelShape, tp: int) -> int:
    """KV bytes per token on each GPU: its share of the KV heads, at least one."""
    heads = math.ceil(shape.kv_heads / tp)
    return 2 * shape.layers * heads * shape.head_dim * shape.kv_dtype_bytes


def weight_room(shape: ModelShape, gpu: GPU, tp: int, eff: Efficiency = EFFICIENCY) -> float:
    """Bytes left for the KV cache on each GPU (negative: the weights do not fit)."""
    return gpu.memory_bytes * eff.memory_utilization - shape.weight_bytes / tp


def roofline(shape: ModelShape, gpu: GPU, tp: int = 1, eff: Efficiency = EFFICIENCY, name: str = "") -> StepCost:
    """The step-time coefficients of one replica of `tp` GPUs; ConfigError when the weights do not fit."""
    if tp < 1 or tp > gpu.max_tp:
        raise ConfigError(f"backend.tp {tp}: one replica joins 1 to {gpu.max_tp} {gpu.name} GPUs")
    room = weight_room(shape, gpu, tp, eff)
    if room <= 0:
        raise ConfigError(f"{shape.title or 'the model'}: {shape.weight_bytes / tp / 1e9:.1f} GB of weights per GPU "
                          f"do not fit in {eff.memory_utilization:.0%} of a {gpu.name}'s "
                          f"{gpu.memory_bytes / 1e9:.0f} GB (raise backend.tp)")
    bw, flop_s = gpu.mem_bw * eff.bandwidth, gpu.flops_for(shape.dtype_bytes)
    per_gpu_kv = kv_bytes_per_gpu(shape, tp)
    reduce_s = 0.0 if tp == 1 else 2 * shape.layers * 2 * (tp - 1) / tp * shape.hidden * ACTIVATION_BYTES \
        / (gpu.link_bw * eff.link)
    step_s = 0.0 if tp == 1 else 2 * shape.layers * gpu.allreduce_latency_s
    compute = 2 * shape.compute_params / tp
    label = name or f"{shape.title or 'model'} on {tp}x {gpu.name}"
    return StepCost(
        overhead_s=eff.overhead_s + step_s,
        weight_s=shape.weight_bytes / tp / bw,
        kv_s_per_token=per_gpu_kv / bw,
        prefill_s_per_token=compute / (flop_s * eff.flops) + reduce_s,
        decode_s_per_row=compute / flop_s + reduce_s,    # NOTE: small matmuls overlap the weight reads; charged at peak
        kv_bytes_per_token=per_gpu_kv * tp,
        kv_budget_bytes=int(room * tp),
        name=label,
        description=(f"{label}: {shape.params / 1e9:.2f}B params"
                     + (f" ({shape.active_params / 1e9:.2f}B active)" if shape.active_params else "")
                     + f", {8 * shape.dtype_bytes}-bit, {ROOFLINE}"),
    )


def rows_that_fit(shape: ModelShape, gpu: GPU, p_max: int, new_tokens: int, reserve_bytes: float, tp: int = 1) -> int:
    """A padded request-level batch's memory limit: B = floor((memory - weights - reserve) /
    ((P_max + new tokens) x KV bytes per token)), every row padded to the longest prompt (0: not even one)."""
    free = tp * (gpu.memory_bytes - shape.weight_bytes / tp) - reserve_bytes
    per_row = (p_max + new_tokens) * kv_bytes_per_gpu(shape, tp) * tp
    return max(0, int(free // per_row))
