"""Every line of the HF backend, the step engine and hf-cb that runs only on CUDA, on a real GPU:
synchronize before stamps, the activation reserve measured by the warm-up batch, fp16/bf16, a
real `torch.OutOfMemoryError` and the back-off from it, the peak-memory window, the device memory
budget, and a random 7B built without an fp32 copy. Skipped, with the reason, where there is no
CUDA (CI, this project's CPU machines); benchmarks/gpu_check.sh runs them on the first GPU lent.
No timing assertions: speed is the GPU check's business.
"""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = [pytest.mark.hf,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs CUDA: exercises the GPU-only paths (no CUDA device here)")]

from batchlab.backends import hf_common as hc  # noqa: E402
from batchlab.backends import random_model as rm  # noqa: E402
from batchlab.backends.hf_backend import HFBackend  # noqa: E402
from batchlab.backends.hf_cb_backend import HFCBBackend  # noqa: E402
from batchlab.backends.hf_engine import StepEngine  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.request import Request, Status  # noqa: E402
from batchlab.core.traffic import TraceItem  # noqa: E402
from batchlab.run.config import load_config  # noqa: E402
from batchlab.run.driver import Inbox, drive  # noqa: E402
from batchlab.run.point import run_point  # noqa: E402
from batchlab.schedulers import ContinuousConfig  # noqa: E402
from batchlab.schedulers.continuous import ContinuousScheduler  # noqa: E402
from tests.backends.test_hf import drive_trace  # noqa: E402

MINI = "random:mini-llama"
MiB = 1 << 20


def cfg_for(dtype="float16", **over):
    sets = ["backend.kind=hf", f"backend.model={MINI}", "backend.device=cuda", f"backend.dtype={dtype}",
            "backend.warmup_batches=1", "strategies=[naive,dynamic]", "naive.batch_size=4",
            "dynamic.max_batch_size=8", "dynamic.max_wait_ms=20", "traffic.rates=[40]", "traffic.duration_s=0.3",
            "traffic.warmup_s=0", "traffic.prompt_len={dist: uniform, low: 3, high: 40}", "traffic.output_len=5"]
    return load_config(None, sets + [f"{k}={v}" for k, v in over.items()])


def started(cfg, shape=(4, 16, 4)) -> HFBackend:
    b = HFBackend(cfg.backend, warmup_shape=shape)
    RealClock().run(b.start(RealClock()))
    return b


def stamped(reqs):
    for r in reqs:
        assert len(r.token_times) == len(r.output_token_ids) == r.max_new_tokens
        assert r.token_times == sorted(r.token_times)


def finished(reqs):
    assert [r.error for r in reqs if r.status is not Status.FINISHED] == []
    stamped(reqs)


@pytest.fixture
def memory_cap():
    """Cap this process's CUDA allocator at what it holds now plus `headroom` bytes, so a real
    out-of-memory error comes from a modest batch (without filling a 140 GB card)."""
    dev = torch.device("cuda")

    def cap(headroom: int) -> None:
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved(dev) + headroom) / total), dev)
    yield cap
    torch.cuda.set_per_process_memory_fraction(1.0, dev)
    torch.cuda.empty_cache()


def test_auto_picks_cuda_and_fp16():
    dev = hc.pick_device("auto")
    assert dev.type == "cuda" and hc.pick_device("cuda").type == "cuda"
    assert hc.pick_dtype("auto", dev) == torch.float16


def test_a_checkpoint_loads_straight_onto_the_gpu_in_fp16(tiny_model_dir):
    """The from_pretrained path (hub names, local paths): device_map puts the weights on the GPU."""
    cfg = load_config(None, ["backend.kind=hf", f"backend.model={tiny_model_dir}", "backend.device=cuda",
                             "backend.dtype=auto"])
    lm = hc.load(cfg.backend)
    assert lm.device.type == "cuda" and lm.dtype == torch.float16
    assert {p.device.type for p in lm.model.parameters()} == {"cuda"} and {p.dtype for p in lm.model.parameters()} == {torch.float16}


def test_a_random_7b_builds_on_the_gpu_without_an_fp32_copy():
    free, _ = torch.cuda.mem_get_info()
    if free < 20 * (1 << 30):
        pytest.skip(f"needs 20 GiB of free GPU memory for a 7B in fp16 (free: {free >> 30} GiB)")
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    model, tok = rm.build("random:mistral-7b", dev, torch.float16)
    try:
        n = sum(p.numel() for p in model.parameters())
        assert n == rm.shape("mistral-7b").published_params
        assert {p.device.type for p in model.parameters()} == {"cuda"} and {p.dtype for p in model.parameters()} == {torch.float16}
        # weights in fp16 and nothing more at any moment: no fp32 (4-byte) copy was ever made
        assert torch.cuda.max_memory_allocated(dev) - before <= 2 * n * 1.01
        with torch.inference_mode():
            logits = model(torch.tensor([[1, 500, 900, 32000]], device=dev)).logits
        assert logits.isfinite().all() and logits.shape[-1] == len(tok) == 32768
    finally:
        del model
        torch.cuda.empty_cache()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_backend_on_cuda_measures_its_reserve_stamps_after_sync_and_runs_a_point(dtype):
    cfg = cfg_for(dtype)
    b = started(cfg)
    try:
        facts = b.describe()
        assert facts["device"].startswith("cuda") and facts["dtype"] == dtype and facts["gpu"]
        assert facts["model"] == "random:mini-llama (random weights)"
        assert isinstance(b.reserve_bytes, int) and b.reserve_bytes >= 0          # measured by the warm-up batch
        assert 0 < b.facts().kv_budget_bytes == hc.device_memory_budget(b.loaded.device, None, b.reserve_bytes)
        clock = RealClock()
        reqs = [Request(f"r{i}", 3 + 5 * i, 2 + i, clock.now(), index=i) for i in range(4)]
        for r in reqs:
            b.prepare(r)
        clock.run(b.run_batch(reqs, clock))
        stamped(reqs)
        assert reqs[0].token_times == reqs[-1].token_times[:2]                   # lockstep: one stamp per step
        for strategy in ("naive", "dynamic"):
            res = run_point(cfg, strategy, 40.0, 0, b)
            assert res.summary["failed"] == 0
            finished(res.requests)
            assert res.meta["peak_mem_kind"] == "cuda_max_memory_allocated" and res.meta["peak_mem_bytes"] > 0
    finally:
        RealClock().run(b.close())


def test_the_device_budget_is_free_plus_cached_minus_the_reserve():
    dev = torch.device("cuda")
    keep = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
    del keep                                             # now cached-but-free inside PyTorch
    small, big = hc.device_memory_budget(dev, None, 0), hc.device_memory_budget(dev, None, 4096 * MiB)
    free, _ = torch.cuda.mem_get_info(dev)
    assert small >= free - hc.MIN_RESERVE_BYTES             # the cached 256 MiB count as free
    assert small - big == pytest.approx(4096 * MiB - hc.MIN_RESERVE_BYTES, abs=64 * MiB)
    assert hc.device_memory_budget(dev, 12345, 0) == 12345


def test_peak_memory_resets_and_reads_what_was_allocated_in_the_window():
    dev = torch.device("cuda")
    peak = hc.PeakMemory(dev)
    peak.reset()
    base = torch.cuda.memory_allocated(dev)
    x = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
    got = peak.read()
    assert got["peak_mem_kind"] == "cuda_max_memory_allocated" and got["peak_mem_bytes"] >= base + 64 * MiB
    del x
    peak.reset()
    assert peak.read()["peak_mem_bytes"] < base + 64 * MiB


def oversize_burst(n: int) -> list[TraceItem]:
    """n ~2,000-token prompts of slightly different lengths: left padding makes generate() build an
    attention mask of n x 2000 x 2000 bytes: ~256 MB at n = 64, over a 128 MiB cap; ~4 MB for one row."""
    return [TraceItem(0.0, 1990 + i % 10, 4) for i in range(n)]


def run_engine(engine, reqs, **budgets) -> None:
    """All of `reqs` arriving now, through a continuous scheduler with `budgets`, on `engine`."""
    clock = RealClock()

    async def main():
        for r in reqs:
            r.arrival_time = clock.now()
        await drive(ContinuousScheduler(ContinuousConfig(**budgets), 1 << 20), engine, clock, Inbox(reqs))
    clock.run(main())


def test_a_real_out_of_memory_error_halves_dynamics_cap_and_loses_nothing(memory_cap):
    cfg = cfg_for(**{"dynamic.max_batch_size": 64})
    b = started(cfg)
    sizes = []
    generate = b._generate
    b._generate = lambda reqs, stamper: (sizes.append(len(reqs)), generate(reqs, stamper))[1]
    try:
        memory_cap(128 * MiB)
        sched, reqs = drive_trace(cfg, "dynamic", b, oversize_burst(64))
    finally:
        RealClock().run(b.close())
    assert sizes[0] == 64 and sched.cap < 64                # the allocator refused 64 rows: the cap halved
    assert len(reqs) == 64
    finished(reqs)


def test_a_real_out_of_memory_error_fails_a_naive_batch_with_the_allocators_words(memory_cap):
    cfg = cfg_for(**{"naive.batch_size": 64})
    b = started(cfg)
    try:
        memory_cap(128 * MiB)
        _, reqs = drive_trace(cfg, "naive", b, oversize_burst(64))
    finally:
        RealClock().run(b.close())
    assert [r.status for r in reqs] == [Status.FAILED] * 64
    assert all(r.error.startswith("out of memory — 64 rows: ") and "CUDA" in r.error for r in reqs)


def test_the_step_engine_on_cuda_matches_generate_token_for_token():
    """float64 on the GPU, as on CPU (tests/backends/test_hf_engine.py says why): equality tests the
    engine's positions, masks and cache slots on CUDA tensors, not one kernel's rounding."""
    from transformers import GenerationConfig
    dev = torch.device("cuda")
    model, tok = rm.build(MINI, dev, torch.float64)
    engine = StepEngine(model, tok, dev)
    g = torch.Generator().manual_seed(0)
    mix = [(5, 9), (23, 6), (40, 5), (3, 14), (17, 8), (31, 7)]
    reqs = [Request(f"r{i}", p, o, 0.0, index=i, prompt_token_ids=torch.randint(10, 1000, (p,), generator=g).tolist())
            for i, (p, o) in enumerate(mix)]
    run_engine(engine, reqs, max_num_seqs=4, max_num_batched_tokens=32)
    finished(reqs)
    for r in reqs:
        ids = torch.tensor([r.prompt_token_ids], device=dev)
        gen = GenerationConfig(max_new_tokens=r.max_new_tokens, min_new_tokens=r.max_new_tokens, do_sample=False,
                               pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
        assert r.output_token_ids == out[0, ids.shape[1]:].tolist(), r.request_id
    assert all(s.duration > 0 for s in engine.step_log)


def test_the_fused_pass_on_cuda_gives_the_module_paths_tokens_and_close_logits():
    """backend.fused is off by default on CUDA, where a wider product may be summed in another
    order. Asked for, it gives the module path's tokens (float64) and logits within float32's
    rounding of the modules' (equality to the bit is asserted on CPU only)."""
    from tests.backends.test_hf_fused import two_passes
    dev = torch.device("cuda")
    model, tok = rm.build(MINI, dev, torch.float64)
    engine = StepEngine(model, tok, dev, fused=True)
    g = torch.Generator().manual_seed(1)
    reqs = [Request(f"r{i}", p, o, 0.0, index=i, prompt_token_ids=torch.randint(10, 1000, (p,), generator=g).tolist())
            for i, (p, o) in enumerate([(5, 9), (23, 6), (40, 5), (3, 14)])]
    run_engine(engine, reqs, max_num_seqs=3, max_num_batched_tokens=32)
    finished(reqs)
    reference = StepEngine(model, tok, dev, fused=False)
    again = [Request(r.request_id, r.prompt_len, r.max_new_tokens, 0.0, index=r.index,
                     prompt_token_ids=r.prompt_token_ids) for r in reqs]
    run_engine(reference, again, max_num_seqs=3, max_num_batched_tokens=32)
    assert [r.output_token_ids for r in reqs] == [r.output_token_ids for r in again]
    model32, _ = rm.build(MINI, dev, torch.float32)
    for fused, modules in zip(two_passes(model32, True), two_passes(model32, False)):
        torch.testing.assert_close(fused, modules, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_step_engine_runs_in_half_precision_on_cuda(dtype):
    """The -inf additive masks and the slot cache in fp16/bf16 through CUDA's SDPA kernels."""
    dev = torch.device("cuda")
    model, tok = rm.build(MINI, dev, dtype)
    engine = StepEngine(model, tok, dev)
    reqs = [Request(f"r{i}", 5 + 9 * i, 3 + i, 0.0, index=i, prompt_token_ids=list(range(10, 15 + 9 * i))) for i in range(5)]
    run_engine(engine, reqs, max_num_seqs=3, max_num_batched_tokens=24)
    finished(reqs)
    assert all(0 <= t < len(tok) for r in reqs for t in r.output_token_ids)


def test_hf_cb_sizes_its_kv_from_the_gpus_free_memory():
    cfg = load_config(None, ["backend.kind=hf-cb", "strategies=[server]", f"backend.model={MINI}", "backend.device=cuda",
                             "backend.dtype=float16"])
    b = HFCBBackend(cfg.backend, cfg.continuous)
    lm = b._ensure_loaded()
    kv = hc.kv_bytes_per_token(lm.model.config, lm.dtype)
    assert b._kv_tokens() == hc.device_memory_budget(lm.device, None) // kv > 0


def test_hf_cb_runs_a_trace_on_cuda_with_exact_lengths():
    cfg = load_config(None, ["backend.kind=hf-cb", "strategies=[server]", f"backend.model={MINI}", "backend.device=cuda",
                             "backend.dtype=float16", "backend.warmup_batches=1", "backend.memory_budget_bytes=67108864"])
    b = HFCBBackend(cfg.backend, cfg.continuous)
    trace = [TraceItem(0.01 * i, 5 + 7 * i, 4 + i) for i in range(6)]
    clock = RealClock()

    async def main():
        await b.start(clock)
        try:
            return await b.run_trace(trace, clock)
        finally:
            await b.close()
    reqs, _ = clock.run(main())
    finished(reqs)
    assert [r.output_len for r in reqs] == [4, 5, 6, 7, 8, 9]
    assert b.describe()["device"].startswith("cuda") and b.num_blocks == 64 * MiB // (16 * 256)
