"""transformers' continuous batching as a backend: a trace in, stamped requests out, nothing lost."""
import asyncio

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends import hf_common as hc  # noqa: E402
from batchlab.backends import make_backend  # noqa: E402
from batchlab.backends.hf_cb_backend import HFCBBackend, _Tracker  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.request import Request, Status  # noqa: E402
from batchlab.core.traffic import TraceItem  # noqa: E402
from batchlab.errors import ConfigError  # noqa: E402
from batchlab.run.config import load_config  # noqa: E402

CB = ["backend.kind=hf-cb", "strategies=[server]", "continuous.num_kv_blocks=64", "backend.warmup_batches=0"]


@pytest.fixture(scope="module")
def lm64(tiny_model_dir):
    """The tiny model in float64, so its greedy tokens can be compared with generate() exactly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # NOTE: see tests/backends/test_hf_engine.py (busy shared CPUs)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    yield hc.Loaded(model, AutoTokenizer.from_pretrained(tiny_model_dir), torch.device("cpu"), torch.float64, "tiny")
    torch.set_num_threads(threads)


def run(backend, trace):
    clock = RealClock()

    async def main():
        await backend.start(clock)
        try:
            return await backend.run_trace(trace, clock)
        finally:
            await backend.close()
    return clock.run(main())


def greedy(lm, r: Request) -> list[int]:
    """generate() with EOS off, as the manager runs (eos_token_id=-1: EOS is an ordinary token)."""
    from transformers import GenerationConfig
    ids = torch.tensor([r.prompt_token_ids])
    gen = GenerationConfig(max_new_tokens=r.max_new_tokens, do_sample=False, eos_token_id=None,
                           pad_token_id=lm.tokenizer.pad_token_id)
    with torch.inference_mode():
        out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    return out[0, ids.shape[1]:].tolist()


def test_a_trace_streams_back_with_exact_lengths_greedy_tokens_and_ordered_stamps(lm64):
    cfg = load_config(None, CB)
    backend = HFCBBackend(cfg.backend, cfg.continuous, lm64)
    trace = [TraceItem(0.01 * i, 5 + 7 * i, 4 + i) for i in range(5)]
    from batchlab.backends import torch_thread
    torch_thread.call(lambda: None)           # our torch thread exists, as after a run on our engine
    reqs, t0 = run(backend, trace)
    assert torch_thread._executor is None     # start() ended it: its OpenMP team would throttle the manager's
    assert [r.status for r in reqs] == [Status.FINISHED] * 5
    assert [r.output_len for r in reqs] == [4, 5, 6, 7, 8]
    assert [r.output_token_ids for r in reqs] == [greedy(lm64, r) for r in reqs]
    for r, item in zip(reqs, trace):
        assert r.arrival_time == pytest.approx(t0 + item.arrival)
        assert r.arrival_time <= r.scheduled_time <= r.token_times[0]
        assert r.token_times == sorted(r.token_times)
    assert backend.manager is None            # close() stopped the generation thread


def test_a_request_that_cannot_fit_fails_with_its_reason_and_the_rest_finish(lm64):
    cfg = load_config(None, CB)
    trace = [TraceItem(0.0, 6, 3), TraceItem(0.0, 10_000, 3), TraceItem(0.01, 8, 2)]
    reqs, _ = run(HFCBBackend(cfg.backend, cfg.continuous, lm64), trace)
    assert [r.status for r in reqs] == [Status.FINISHED, Status.FAILED, Status.FINISHED]
    assert "context" in reqs[1].error


def test_a_dead_generation_thread_fails_every_pending_request():
    class DeadManager:
        is_running = staticmethod(lambda: False)
        background_thread_status = type("S", (), {"fatal_error": RuntimeError("boom")})()

    tracker = _Tracker(tokenizer=None)
    reqs = [Request("a", 4, 2, 0.0), Request("b", 4, 2, 0.0)]
    for r in reqs:
        tracker.add(r)
    RealClock().run(tracker.wait_all(DeadManager(), RealClock()))
    assert [r.status for r in reqs] == [Status.FAILED] * 2 and "boom" in reqs[0].error


def test_config_selects_hf_cb_only_with_the_server_strategy():
    backend = make_backend(load_config(None, CB))
    assert isinstance(backend, HFCBBackend) and backend.manager is None     # nothing loaded yet
    with pytest.raises(ConfigError, match="server"):
        load_config(None, ["backend.kind=hf-cb", "strategies=[continuous]"])
    assert isinstance(make_backend(load_config(None, CB)), HFCBBackend)


def test_it_refuses_a_virtual_clock():
    from batchlab.core.clock import VirtualClock
    cfg = load_config(None, CB)
    clock = VirtualClock()
    with pytest.raises(ValueError, match="RealClock"):
        clock.run(HFCBBackend(cfg.backend, cfg.continuous).start(clock))
    assert asyncio.iscoroutinefunction(HFCBBackend.run_trace)


def test_a_model_that_cannot_be_loaded_is_one_config_error_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    b = HFCBBackend(load_config(None, CB + [f"backend.model={tmp_path}"]).backend, load_config(None, CB).continuous)
    with pytest.raises(ConfigError) as e:
        RealClock().run(b.start(RealClock()))
    assert "cannot load backend.model" in str(e.value) and "\n" not in str(e.value)
