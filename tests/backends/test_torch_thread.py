"""The torch thread (backends/torch_thread.py): one thread per process for torch work, and the
step engine's passes, cache growth and slot releases all on it."""
import asyncio
import multiprocessing
import threading

import pytest

from batchlab.backends import torch_thread


def where() -> tuple[int, str]:
    return threading.get_ident(), threading.current_thread().name


def test_run_and_call_use_one_named_thread_and_nest_without_waiting_on_themselves():
    async def main():
        return [await torch_thread.run(where) for _ in range(5)]
    firsts = asyncio.run(main())
    called = [torch_thread.call(where) for _ in range(5)]
    assert len(set(firsts + called)) == 1
    ident, name = firsts[0]
    assert ident != threading.get_ident() and name.startswith(torch_thread.NAME)
    # a call made on the thread runs inline (submitting would wait on itself for ever)
    assert torch_thread.call(lambda: torch_thread.call(where)) == firsts[0]
    assert not torch_thread.on_it()


def test_release_ends_the_thread_and_the_next_call_starts_another():
    first = torch_thread.call(threading.current_thread)
    torch_thread.release()
    assert not first.is_alive()
    second = torch_thread.call(threading.current_thread)
    assert second is not first and second.name.startswith(torch_thread.NAME)
    with pytest.raises(RuntimeError, match="from the torch thread"):
        torch_thread.call(torch_thread.release)
    torch_thread.release()
    torch_thread.release()                                    # nothing to end: a no-op


def _child(queue) -> None:
    queue.put(torch_thread.call(where)[1])


def test_a_forked_child_gets_a_thread_of_its_own():
    """The child inherits the parent's executor but not its thread: keyed by pid, it starts its own."""
    torch_thread.call(where)                                  # the parent's thread exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and queue.get(timeout=5).startswith(torch_thread.NAME)


@pytest.mark.hf
def test_the_model_loads_on_the_torch_thread(monkeypatch):
    pytest.importorskip("torch")
    from batchlab.backends import hf_common
    seen = []
    monkeypatch.setattr(hf_common, "load", lambda cfg: seen.append(where()) or hf_common.Loaded(None, None, "cpu", None, "fake"))
    monkeypatch.setattr(hf_common, "PeakMemory", lambda device: None)
    hf_common.LoadedModel(cfg=None).get()
    assert seen == [torch_thread.call(where)]


@pytest.mark.hf
def test_the_engine_plans_runs_and_releases_on_the_torch_thread(lm):
    """Everything that runs parallel torch ops (planning grows the cache, the passes, a release
    copies a slot) on one thread, none on the event loop's."""
    pytest.importorskip("torch")
    from batchlab.backends.hf_engine import StepEngine
    from batchlab.core.clock import RealClock
    from batchlab.core.work import Step
    from tests.backends.test_hf_engine import make
    engine, seen = StepEngine(lm[0], lm[1]), []
    for name in ("_plan", "forward"):
        inner = getattr(engine, name)
        setattr(engine, name, lambda *a, inner=inner, name=name, **k: seen.append((name, where())) or inner(*a, **k))
    release = engine.cache.release
    engine.cache.release = lambda r: seen.append(("release", where())) or release(r)
    reqs = make([(5, 2, 0), (9, 2, 0)])
    clock = RealClock()
    asyncio.run(engine.step(Step([(r, r.prompt_len) for r in reqs]), clock))
    engine.release(reqs[0])
    assert {n for n, _ in seen} == {"_plan", "forward", "release"}
    assert {w for _, w in seen} == {torch_thread.call(where)}
