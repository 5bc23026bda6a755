"""The long commands killed at random moments (seeded), then rerun.

A kill lands anywhere: during start-up, mid-point, mid-write. Whatever was recorded before it must
be there after it, byte for byte, and rerunning the same command must finish the work: for
`batchlab run`, to the bytes of a run that was never interrupted. SIGKILL and SIGTERM end a
process without a word; SIGINT (Ctrl-C) ends it in one line, exit status 130.
"""
from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from batchlab.run.results import ResultsDir
from tests.faults.conftest import ENDS_WITHIN_S, batchlab, finish, kill_after, one_error_line, run, wait_for_path
from tests.run.test_sweep import assert_same_files
from tests.server.conftest import ServeProcess, free_port

KILLS = random.Random(7)          # the moments and signals of every kill in this module, the same each run
SWEEP = ["run", "--quiet", "--set", "strategies=[naive, dynamic, continuous]", "--set", "traffic.rates=[4, 8, 16]",
         "--set", "traffic.duration_s=60", "--set", "traffic.warmup_s=1", "--set", "report=false"]


def timed(*args: str, started: Path | None = None, **kw) -> tuple[float, float]:
    """Run a command to completion: (seconds until `started` appeared, seconds in all); the kills
    are drawn from the window between, where the work and the writing happen."""
    began = time.monotonic()
    proc = batchlab(*args, **kw)
    first = wait_for_path(started, proc) and time.monotonic() - began if started else 0.0
    status, _, err = finish(proc)
    assert status == 0, err[-2000:]
    return first or 0.0, time.monotonic() - began


def kill_at_random(*args: str, window: tuple[float, float], **kw) -> int:
    """Start the command and kill it with SIGKILL or SIGTERM at a random moment of its working
    window (between the reference run's start-up and its end) or, one time in four, of its whole
    run, start-up included; its exit status."""
    proc = batchlab(*args, **kw)
    first, total = window
    delay = KILLS.uniform(first, total) if KILLS.random() < 0.75 else KILLS.uniform(0.2, total)
    kill_after(proc, delay, KILLS.choice([signal.SIGKILL, signal.SIGTERM]))
    status, _, err = finish(proc)
    assert "Traceback" not in err, err[-2000:]
    return status


def intact(out) -> dict:
    """Every intact point: its request rows and its summary row less wall_s, as recorded."""
    scan = ResultsDir(out).scan()
    at = scan.header.index("wall_s") if scan.header else None
    return {k: ([r.raw for r in p.rows], p.summary.fields[:at] + p.summary.fields[at + 1:]) for k, p in scan.points.items()}


def test_a_sweep_killed_at_random_moments_keeps_every_point_and_resumes_to_the_same_bytes(tmp_path):
    """Twice: kill a sweep twice in a row, then rerun it to the end."""
    reference = tmp_path / "reference"
    window = timed(*SWEEP, "--out", str(reference), started=reference / "experiment.json")
    expected = intact(reference)
    for attempt in range(2):
        out, seen = tmp_path / f"r{attempt}", {}
        for _ in range(2):
            kill_at_random(*SWEEP, "--out", str(out), window=window)
            now = intact(out)
            assert all(now.get(k) == v for k, v in seen.items()), "a recorded point was harmed"
            assert all(v == expected[k] for k, v in now.items())
            seen = now
        assert run(*SWEEP, "--out", str(out))[0] == 0
        assert_same_files(reference, out)


def test_a_sweep_interrupted_with_ctrl_c_says_so_in_one_line_and_resumes(tmp_path):
    out = tmp_path / "r"
    proc = batchlab(*SWEEP, "--out", str(out))
    if wait_for_path(out / "summary.csv", proc):
        proc.send_signal(signal.SIGINT)
    status, _, err = finish(proc)
    if status != 0:                                   # it may have finished first on a fast machine
        assert status == 130 and one_error_line(err, "interrupted: ").endswith("rerun the same command to resume")
    assert run(*SWEEP, "--out", str(out))[0] == 0 and len(ResultsDir(out).done_points()) == 9


def valid_json(path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


SEARCHES = {
    "tune": ["tune", "--slo", "ttft_p99=1s", "--set", "traffic.rates=[10]", "--set", "backend.preset=toy",
                 "--set", "traffic.duration_s=10", "--max-cap", "64"],
    "capacity": ["capacity", "--set", "strategies=[naive, continuous]", "--set", "traffic.duration_s=10",
                 "--set", "traffic.warmup_s=1", "--set", "traffic.rates=[2, 16]"],
}


@pytest.mark.parametrize("command", list(SEARCHES))
def test_a_search_killed_at_random_moments_keeps_its_last_result_and_reruns(tmp_path, command):
    out = tmp_path / "out"
    written = out / f"{command}.json"
    window = timed(*SEARCHES[command], "--out", str(out))
    before = written.read_text()
    for _ in range(2):
        kill_at_random(*SEARCHES[command], "--out", str(out), window=window)
        assert valid_json(written), f"{written} was left unreadable"
    assert run(*SEARCHES[command], "--out", str(out))[0] == 0
    assert json.loads(written.read_text()).keys() == json.loads(before).keys()


def test_validate_killed_at_a_random_moment_resumes_from_what_it_kept(tmp_path):
    (tmp_path / "v.yaml").write_text("strategies: [continuous]\ntraffic: {rates: [4], duration_s: 5, warmup_s: 1}\n")
    assert run("profile", "--preset", "toy", "--out", str(tmp_path / "toy.json"))[0] == 0
    args = ["validate", str(tmp_path / "v.yaml"), "--profile", str(tmp_path / "toy.json"), "--out", str(tmp_path / "out")]
    kill_at_random(*args, window=(1.0, 5.0))         # start-up takes about 1 s, the work about 4
    status, _, err = run(*args)
    assert status == 0, err[-2000:]
    assert valid_json(tmp_path / "out" / "accuracy.json")


def test_loadtest_killed_at_random_moments_leaves_no_half_result_and_reruns(tmp_path):
    out = tmp_path / "load.json"
    with ServeProcess() as server:
        args = ["loadtest", server.url + "/v1", "--concurrency", "1,4", "--per-user", "4", "--output-len", "8",
                "--prompt-len", "8", "--out", str(out)]
        window = timed(*args)
        kill_at_random(*args, window=window)
        assert valid_json(out), f"{out} was left unreadable"
        assert run(*args)[0] == 0 and valid_json(out)


PROFILE = ["profile", "--set", "backend.preset=toy"]          # the simulator measured in virtual time: the same fit each run


def fit_of(path) -> dict:
    """A profile less its record of the machine it ran on (load average)."""
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "setup"}


def test_profile_killed_at_random_moments_keeps_the_previous_profile_and_reruns(tmp_path):
    out = tmp_path / "p.json"
    window = timed(*PROFILE, "--out", str(out))
    fitted = fit_of(out)
    out.write_text('{"a previous profile": true}\n')
    for _ in range(2):
        kill_at_random(*PROFILE, "--out", str(out), window=window)
        now = json.loads(out.read_text())                 # the previous profile, or a whole new one
        assert now == {"a previous profile": True} or fit_of(out) == fitted
        assert [p.name for p in tmp_path.iterdir()] == ["p.json"]
    assert run(*PROFILE, "--out", str(out))[0] == 0
    assert fit_of(out) == fitted


def test_a_server_profile_killed_at_a_random_moment_harms_neither_the_last_profile_nor_the_server(tmp_path):
    out = tmp_path / "p.json"
    out.write_text('{"a previous profile": true}\n')
    with ServeProcess() as server:
        args = ["profile", "--set", "backend.kind=openai", "--set", f"backend.base_url={server.url}/v1",
                "--set", "backend.model=toy", "--set", "strategies=[server]", "--batch-sizes", "1,4", "--contexts", "16,32",
                "--prompts", "16,64", "--repeats", "1", "--warmup", "0", "--new-tokens", "10", "--gap-ms", "10",
                "--out", str(out)]
        kill_at_random(*args, window=(1.0, 4.0))           # start-up about 1 s, the probes about 3
        now = json.loads(out.read_text())                 # the previous profile, or (it finished first) a whole new one
        assert now == {"a previous profile": True} and {p.name for p in tmp_path.iterdir()} == {"p.json"} or \
            len(now["samples"]) >= 8 and {p.name for p in tmp_path.iterdir()} <= {"p.json", "p.twin.yaml"}
        answer = httpx.post(server.url + "/v1/completions", json={"model": "toy", "prompt": "hi", "max_tokens": 4}, timeout=10)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4


def load(url: str, stop: threading.Event, ended: list) -> None:
    """Streams completions until `stop`; each ends with an answer or an error, none hangs."""
    while not stop.is_set():
        try:
            with httpx.stream("POST", url + "/v1/completions", timeout=10,
                              json={"model": "toy", "prompt": "hi", "max_tokens": 32, "stream": True}) as r:
                for _ in r.iter_lines():
                    pass
            ended.append(r.status_code)
        except httpx.HTTPError as e:
            ended.append(type(e).__name__)


def test_serve_killed_at_random_moments_under_load_comes_back_on_the_same_port():
    port = free_port()
    for _ in range(2):
        with ServeProcess(port=port) as server:
            stop, ended = threading.Event(), []
            clients = [threading.Thread(target=load, args=(server.url, stop, ended)) for _ in range(4)]
            for c in clients:
                c.start()
            kill_after(server.proc, KILLS.uniform(0.2, 2.0), KILLS.choice([signal.SIGKILL, signal.SIGTERM]))
            server.proc.wait(ENDS_WITHIN_S)                 # SIGTERM: in flight end within --shutdown-timeout
            stop.set()
            for c in clients:
                c.join(ENDS_WITHIN_S)
            assert not any(c.is_alive() for c in clients) and ended, "a client hung on a killed server"
    with ServeProcess(port=port) as server:                 # the port is free again at once (SO_REUSEADDR)
        answer = httpx.post(server.url + "/v1/completions", json={"model": "toy", "prompt": "hi", "max_tokens": 4}, timeout=10)
        assert answer.status_code == 200
