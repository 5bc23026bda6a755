"""The Hugging Face backend on the tiny random Llama (CPU, tiny lengths, no timing assertions)."""
import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

import torch  # noqa: E402

from batchlab.backends import hf_common as hc  # noqa: E402
from batchlab.backends import hf_hub  # noqa: E402
from batchlab.backends.hf_backend import HFBackend  # noqa: E402
from batchlab.core.clock import RealClock  # noqa: E402
from batchlab.core.config import RunConfig  # noqa: E402
from batchlab.core.request import Request, Status  # noqa: E402
from batchlab.core.traffic import TraceItem, make_requests  # noqa: E402
from batchlab.errors import ConfigError  # noqa: E402
from batchlab.run.config import validate  # noqa: E402
from batchlab.run.driver import Inbox, drive, given  # noqa: E402
from batchlab.run.point import run_point  # noqa: E402
from batchlab.schedulers import make_scheduler  # noqa: E402


def make_cfg(model_dir, **over) -> RunConfig:
    tree = {
        "backend": {"kind": "hf", "model": str(model_dir), "device": "cpu", "warmup_batches": 1},
        "strategies": ["naive", "dynamic"],
        "naive": {"batch_size": 4},
        "dynamic": {"max_batch_size": 8, "max_wait_ms": 20},
        "traffic": {"rates": [40], "duration_s": 0.3, "warmup_s": 0, "seed": 1,
                    "prompt_len": {"dist": "uniform", "low": 3, "high": 12},
                    "output_len": {"dist": "uniform", "low": 1, "high": 6}},
    }
    for key, value in over.items():
        section, name = key.split("__")
        tree.setdefault(section, {})[name] = value
    return validate(tree)


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = HFBackend(make_cfg(tiny_model_dir).backend, warmup_shape=(2, 4, 2))
    RealClock().run(b.start(RealClock()))
    return b


def burst(n: int, prompt: int = 6, out: int = 3) -> list[TraceItem]:
    """n requests that all arrive at once, so the scheduler can form full batches."""
    return [TraceItem(0.0, prompt + i % 3, out + i % 2) for i in range(n)]


def drive_trace(cfg, strategy, backend, trace):
    clock = RealClock()

    async def main():
        sched = make_scheduler(strategy, cfg, given(cfg, backend.facts(), live=False))
        reqs = make_requests(trace, clock.now(), backend.prepare)
        await drive(sched, backend, clock, Inbox(reqs))
        return sched, reqs
    return clock.run(main())


def assert_stamped(requests):
    for r in requests:
        assert r.status is Status.FINISHED, r.error
        assert r.arrival_time <= r.scheduled_time <= r.first_token_time <= r.completion_time
        assert len(r.token_times) == r.max_new_tokens == len(r.output_token_ids)
        assert r.token_times == sorted(r.token_times)


def test_loads_through_from_pretrained(backend, tiny_model_dir):
    facts = backend.describe()
    assert facts["device"] == "cpu" and facts["dtype"] == "float32"
    assert facts["model_path"] == str(tiny_model_dir)
    assert facts["kv_bytes_per_token"] == 2 * 4 * 2 * 64 * 4     # layers, kv heads, head_dim, fp32
    assert backend.loaded.tokenizer.padding_side == "left"


def test_kv_bytes_per_token_from_config():
    from transformers import LlamaConfig
    mistral = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8)
    assert hc.kv_bytes_per_token(mistral, torch.float16) == 2 * 32 * 8 * 128 * 2   # 128 KiB


def test_batch_stamps_and_exact_lengths(backend):
    clock = RealClock()
    reqs = [Request(f"r{i}", 3 + 2 * i, 1 + 2 * i, clock.now(), index=i) for i in range(4)]
    for r in reqs:
        backend.prepare(r)
    clock.run(backend.run_batch(reqs, clock))
    longest = reqs[-1]
    for r in reqs:
        assert len(r.token_times) == len(r.output_token_ids) == r.max_new_tokens
        assert r.token_times == longest.token_times[: r.max_new_tokens]   # lockstep: shared steps
        assert r.output_text == backend.loaded.tokenizer.decode(r.output_token_ids, skip_special_tokens=True)
    assert longest.token_times == sorted(longest.token_times)


def test_left_padding_does_not_change_greedy_output(backend):
    clock = RealClock()
    short, long_ = (Request(n, p, 4, clock.now(), index=i) for i, (n, p) in enumerate([("s", 3), ("l", 11)]))
    alone = Request("s2", 3, 4, clock.now(), index=0)
    for r in (short, long_, alone):
        backend.prepare(r)
    clock.run(backend.run_batch([short, long_], clock))
    clock.run(backend.run_batch([alone], clock))
    assert short.output_token_ids == alone.output_token_ids


@pytest.mark.parametrize("strategy", ["naive", "dynamic"])
def test_run_point_end_to_end(backend, tiny_model_dir, strategy):
    cfg = make_cfg(tiny_model_dir)
    res = run_point(cfg, strategy, 40.0, 0, backend)
    assert res.requests and res.summary["failed"] == 0
    assert_stamped(res.requests)
    assert res.meta["peak_mem_kind"] == "cpu_peak_rss_above_baseline" and res.meta["peak_mem_bytes"] >= 0


def test_injected_oom_backs_off_and_loses_nothing(backend, tiny_model_dir):
    cfg = make_cfg(tiny_model_dir)
    sizes = []

    def oom_when(batch):
        sizes.append(len(batch))
        return len(batch) > 2
    backend.oom_when = oom_when
    try:
        sched, reqs = drive_trace(cfg, "dynamic", backend, burst(10))
    finally:
        backend.oom_when = None
    assert sizes[0] == 8 and 4 in sizes                # 8 -> OOM -> cap 4 -> OOM -> cap 2
    assert sched.cap == 2 and max(sizes[sizes.index(2):]) <= 2
    assert len(reqs) == 10
    assert_stamped(reqs)


def test_naive_records_oom_as_failures(backend, tiny_model_dir):
    cfg = make_cfg(tiny_model_dir)
    backend.oom_when = lambda batch: True
    try:
        _, reqs = drive_trace(cfg, "naive", backend, burst(4))
    finally:
        backend.oom_when = None
    assert [r.status for r in reqs] == [Status.FAILED] * 4
    assert all(r.error.startswith("out of memory — 4 rows: ") for r in reqs)   # with the allocator's own words


def test_memory_trigger_with_small_budget(backend, tiny_model_dir):
    kv = 4096
    budget = 3 * (8 + 4) * kv                          # three rows of 8 prompt + 4 output tokens
    cfg = make_cfg(tiny_model_dir, backend__memory_budget_bytes=budget)
    backend.cfg, saved = cfg.backend, backend.cfg
    try:
        assert backend.facts().kv_budget_bytes == budget
        _, reqs = drive_trace(cfg, "dynamic", backend, [TraceItem(0.0, 8, 4) for _ in range(7)])
    finally:
        backend.cfg = saved
    assert_stamped(reqs)
    batches: dict[float, list[Request]] = {}
    for r in reqs:
        batches.setdefault(r.scheduled_time, []).append(r)
    assert [len(v) for v in batches.values()] == [3, 3, 1]
    assert [r.trigger for r in reqs[:6]] == ["memory"] * 6


def test_bad_prompts_are_rejected(backend):
    with pytest.raises(ValueError, match="empty prompt"):
        backend.prepare(Request("e", 0, 4, 0.0))
    with pytest.raises(ValueError, match="model context"):
        backend.prepare(Request("big", 5000, 4, 0.0))


def test_prompt_ids_exact_and_deterministic(backend):
    tok = backend.loaded.tokenizer
    a = hc.prompt_ids(Request("a", 50, 1, 0.0, index=7), tok)
    assert a == hc.prompt_ids(Request("b", 50, 1, 0.0, index=7), tok) and len(a) == 50
    assert not set(a) & set(tok.all_special_ids)
    assert a != hc.prompt_ids(Request("c", 50, 1, 0.0, index=8), tok)
    text = hc.prompt_ids(Request("t", 40, 1, 0.0, prompt="hello world"), tok)
    assert len(text) == 40 and text[: len(tok("hello world")["input_ids"])] == tok("hello world")["input_ids"]


def test_synthetic_prompts_draw_from_one_table_kept_per_tokenizer(backend):
    tok = backend.loaded.tokenizer
    special = tuple(tok.all_special_ids)
    table = hc._ordinary_ids(len(tok), special)
    assert table is hc._ordinary_ids(len(tok), special)          # computed once, not per request
    assert not table.flags.writeable                              # shared: no caller may change it
    assert len(table) == len(tok) - len(set(special)) and not set(table.tolist()) & set(special)
    ids = hc.prompt_ids(Request("a", 30, 1, 0.0, index=3), tok)
    assert set(ids) <= set(table.tolist())


def test_device_and_dtype_choice():
    assert hc.pick_dtype("auto", torch.device("cpu")) == torch.float32
    assert hc.pick_dtype("auto", torch.device("cuda")) == torch.float16
    with pytest.raises(ValueError, match="backend.dtype"):
        hc.pick_dtype("float8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            hc.pick_device("cuda")


def test_tiny_alias_and_threads_setting(tiny_model_dir):
    from batchlab.backends.hf import HFOptions
    before = torch.get_num_threads()
    try:
        lm = hc.load(HFOptions(model="tiny", device="cpu", threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert lm.name == "tiny" and lm.device.type == "cpu" and lm.dtype == torch.float32
    assert lm.model.name_or_path == str(tiny_model_dir)


def test_tokens_reach_their_requests_while_the_batch_is_still_generating():
    """Each stopping-criterion call puts every row's newest token on its request at once, so a
    server streams request-level batches token by token instead of in one burst at the end."""
    import torch

    from batchlab.backends.hf_backend import StampEveryToken
    from batchlab.core.request import Request

    class Tick:
        t = 0.0

        def now(self):
            self.t += 1.0
            return self.t

    a, b = Request("a", 2, 2, 0.0), Request("b", 2, 1, 0.0)
    stamper = StampEveryToken(Tick(), torch.device("cpu"), [a, b])
    stamper(torch.tensor([[5, 6, 7], [8, 9, 10]]), None)
    assert (a.output_token_ids, b.output_token_ids) == ([7], [10]) and a.token_times == [1.0]
    stamper(torch.tensor([[5, 6, 7, 11], [8, 9, 10, 12]]), None)
    assert a.output_token_ids == [7, 11] and a.token_times == [1.0, 2.0]
    assert b.output_token_ids == [10] and b.token_times == [1.0]     # b reached its target


# -- preflight: backend.model checked before anything is written -----------------------------------

def bounded(fn, seconds: float = 60.0):
    """Run fn() in a thread; fail if it has not returned or raised within `seconds` (a generous
    bound for a promise of 'seconds', not a benchmark)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=seconds)


@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache and a hub endpoint that refuses connections (a closed port)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "hub-cache"


def test_model_paths_that_do_not_hold_a_model_fail_in_one_line(tmp_path, tiny_model_dir):
    assert hf_hub.check_model(str(tiny_model_dir)) == [] and hf_hub.check_model("tiny") == [] and hf_hub.check_model(None) == []
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.bin").write_text("x")
    cases = {"/no/such/model/dir": "no such directory: /no/such/model/dir",
             "./relative/../nope": "no such directory",
             str(tmp_path / "empty"): "is not a model directory (no config.json in it)",
             str(tmp_path / "file.bin"): "is a file; expected a model directory"}
    for name, message in cases.items():
        with pytest.raises(ConfigError) as e:
            hf_hub.check_model(name)
        assert message in str(e.value) and "\n" not in str(e.value)


def test_an_uncached_hub_name_without_a_reachable_hub_fails_in_seconds(no_hub):
    with pytest.raises(ConfigError) as e:
        bounded(lambda: hf_hub.check_model("someorg/some-model-7b"))
    assert "not a local directory nor in the Hugging Face cache" in str(e.value)
    assert "cannot be reached" in str(e.value) and "\n" not in str(e.value)


def test_hf_hub_offline_refuses_an_uncached_name_without_probing(no_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_hub, "hub_reachable", lambda: pytest.fail("probed the hub although offline"))
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set"):
        hf_hub.check_model("someorg/some-model-7b")


def test_a_cached_hub_name_passes_and_loads_offline(no_hub, tiny_model_dir):
    """Lay the tiny model out as huggingface_hub caches a download; it loads with no hub."""
    import shutil
    repo = no_hub / "models--someorg--tiny-cached"
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model_dir, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    warnings = bounded(lambda: hf_hub.check_model("someorg/tiny-cached"))
    assert warnings == ["backend.model 'someorg/tiny-cached': the hub is unreachable; loading the cached copy"]
    from batchlab.backends.hf import HFOptions
    lm = bounded(lambda: hc.load(HFOptions(model="someorg/tiny-cached", device="cpu")))
    assert lm.name == "someorg/tiny-cached" and lm.model.config.num_hidden_layers == 4


def test_preflight_checks_device_and_model_and_load_errors_are_config_errors(tmp_path):
    from batchlab.run.sweep import preflight
    with pytest.raises(ConfigError, match="no such directory"):
        preflight(make_cfg("/no/such/model/dir"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device here"):
            preflight(make_cfg(tmp_path, backend__device="cuda"))
    (tmp_path / "config.json").write_text("{}")           # passes the cheap check, still not a model
    b = HFBackend(make_cfg(tmp_path).backend)
    with pytest.raises(ConfigError) as e:
        RealClock().run(b.start(RealClock()))
    assert str(e.value).startswith(f"cannot load backend.model '{tmp_path}': ") and "\n" not in str(e.value)


def test_the_hub_probe_says_reachable_only_when_something_answers(no_hub, monkeypatch):
    import http.server
    import threading
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)   # answers 501
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert bounded(lambda: hf_hub._probe(url, 5.0)) is True
        monkeypatch.setenv("HF_ENDPOINT", url)      # reachable: an uncached name is left to download at load
        assert hf_hub.check_model("someorg/not-cached-yet") == []
    finally:
        server.shutdown()
    # Still listening but no longer answering (a black hole): the probe gives up at its deadline.
    assert bounded(lambda: hf_hub._probe(url, 2.0)) is False
