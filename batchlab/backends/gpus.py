"""A catalog of GPUs for sizing: datasheet memory, bandwidth, dense tensor FLOP/s per dtype, the
link between GPUs of one replica, and an editable default price per GPU-hour.

Every figure here is a vendor's peak; what a serving engine reaches is a share of it (EFFICIENCY,
with where each share comes from), and every step time derived from them is labelled a roofline
estimate. FLOP/s are dense (datasheets quote "with sparsity" at twice these), for 16-bit inputs
with 32-bit accumulation (GeForce cards run that at half their FP16-accumulate rate).
Prices are on-demand cloud prices per GPU-hour as listed in 2026 (Lambda, RunPod, Nebius, Hyperstack;
a hyperscaler charges up to twice as much), a starting point to edit (`backend.usd_per_gpu_hour`), not a quote.
"""
from __future__ import annotations

from dataclasses import dataclass

from batchlab.errors import ConfigError

GB = 1e9


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: float
    mem_bw: float                   # bytes/s, peak HBM/GDDR bandwidth
    flops: float                    # dense 16-bit tensor FLOP/s (fp32 accumulate), peak
    link_bw: float                  # bytes/s one way, per GPU, to the others of its replica (NVLink, else PCIe)
    link: str                       # what that link is
    usd_per_hour: float             # on-demand $ per GPU-hour (editable default)
    fp8_flops: float = 0.0          # dense FP8 tensor FLOP/s; 0: no FP8 tensor cores
    allreduce_latency_s: float = 10e-6   # one small all-reduce among its replica's GPUs (launch + sync)
    max_tp: int = 8                 # GPUs one node joins into a replica
    source: str = ""

    def flops_for(self, dtype_bytes: int) -> float:
        """Peak FLOP/s for weights of `dtype_bytes` (1: FP8)."""
        if dtype_bytes == 1:
            if not self.fp8_flops:
                raise ConfigError(f"{self.name} has no FP8 tensor cores: serve the model in 16 bits (backend.dtype: bf16)")
            return self.fp8_flops
        return self.flops


@dataclass(frozen=True)
class Efficiency:
    """What a serving engine reaches of a GPU's peaks, and where each share was read."""
    bandwidth: float = 0.8          # decode's weight and KV reads
    flops: float = 0.5              # prefill's large matrix products (model FLOPs utilisation)
    link: float = 0.7               # an all-reduce's bus bandwidth over the link's peak
    memory_utilization: float = 0.9  # share of memory the engine takes (vLLM's --gpu-memory-utilization default)
    overhead_s: float = 1e-3        # per step: scheduling, sampling, launches
    source: str = ""


# NOTE: the shares published measurements put serving at (docs/guides/sizing.md cites them): decode
# at batch 1 reads weights at 69-83 % of peak bandwidth (gpt-fast on A100, vLLM on A100 77 %);
# prefill end to end reaches 40-50 % of peak FLOP/s (large GEMMs alone ~80 %); all-reduce models
# take ~0.65-0.8 of a link's peak and ~10 us per small all-reduce on NVLink (custom kernels), ~25 us
# over PCIe with NCCL.
EFFICIENCY = Efficiency(source="decode reads at 0.8 of peak bandwidth, prefill at 0.5 of peak FLOP/s, links at 0.7")

CATALOG: dict[str, GPU] = {g.name: g for g in [
    GPU("H100-SXM", 80 * GB, 3.35e12, 989e12, 450 * GB, "NVLink 4 (900 GB/s both ways)", 3.00, fp8_flops=1979e12,
        source="NVIDIA H100 datasheet (SXM5)"),
    GPU("H100-PCIe", 80 * GB, 2.0e12, 756e12, 64 * GB, "PCIe Gen5 x16", 2.50, fp8_flops=1513e12,
        allreduce_latency_s=25e-6, source="NVIDIA H100 datasheet (PCIe)"),
    GPU("H200", 141 * GB, 4.8e12, 989e12, 450 * GB, "NVLink 4 (900 GB/s both ways)", 4.00, fp8_flops=1979e12,
        source="NVIDIA H200 datasheet (SXM)"),
    GPU("B200", 180 * GB, 8.0e12, 2250e12, 900 * GB, "NVLink 5 (1.8 TB/s both ways)", 6.00, fp8_flops=4500e12,
        source="NVIDIA HGX B200 datasheet (per GPU)"),
    GPU("A100-80GB", 80 * GB, 2.039e12, 312e12, 300 * GB, "NVLink 3 (600 GB/s both ways)", 1.80,
        source="NVIDIA A100 datasheet (SXM4 80GB)"),
    GPU("A100-40GB", 40 * GB, 1.555e12, 312e12, 300 * GB, "NVLink 3 (600 GB/s both ways)", 1.50,
        source="NVIDIA A100 datasheet (SXM4 40GB)"),
    GPU("L40S", 48 * GB, 864e9, 362e12, 32 * GB, "PCIe Gen4 x16", 0.90, fp8_flops=733e12,
        allreduce_latency_s=25e-6, source="NVIDIA L40S datasheet"),
    GPU("RTX-4090", 24 * GB, 1008e9, 165.2e12, 32 * GB, "PCIe Gen4 x16", 0.40, fp8_flops=330.3e12,
        allreduce_latency_s=25e-6, source="NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090)"),
    GPU("RTX-3090", 24 * GB, 936e9, 71e12, 32 * GB, "PCIe Gen4 x16", 0.25,
        allreduce_latency_s=25e-6, source="NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3090)"),
]}


def gpu(name: str) -> GPU:
    """The catalog's entry, matched without regard to case; one line naming the known ones."""
    for key, entry in CATALOG.items():
        if key.lower() == name.strip().lower():
            return entry
    raise ConfigError(f"backend.gpu {name!r}: not in the catalog (known: {', '.join(CATALOG)})")
