"""The seed's load-test script runs against `batchlab serve` started from the command line.

The script is read from the shared seed file at test time (not copied here). The server is
started as `batchlab serve --model-name local-model`, the name the script asks for, so its only
change is the port in its URL (tests pick a free one instead of 8000). The script shares one
AsyncOpenAI client across asyncio.run() calls, so a kept-alive connection from the previous
level's (closed) event loop breaks its next level against any keep-alive server, vLLM included;
`--no-keep-alive` closes every connection after its response.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import free_port

# The shared folder sits beside the checkout (or beside the folder of worktrees): the nearest one up.
SEED = next((p / "shared" / "seeds" / "continuous-batching-and-slo-tuning.txt" for p in Path(__file__).resolve().parents[3:]
             if (p / "shared" / "seeds").is_dir()), Path("shared/seeds/continuous-batching-and-slo-tuning.txt"))


def seed_loadtest() -> str:
    if not SEED.is_file():
        pytest.skip(f"seed file not found: {SEED}")
    text = SEED.read_text()
    start = text.index("loadtest.py") + len("loadtest.py")
    return text[start:text.index("def throughput", start)]


def test_seed_loadtest_runs_unchanged_apart_from_the_port(tmp_path):
    script = seed_loadtest()
    port = free_port()
    (tmp_path / "loadtest.py").write_text(script.replace("localhost:8000", f"127.0.0.1:{port}"))
    server = subprocess.Popen([sys.executable, "-m", "batchlab.cli", "serve", "--strategy", "continuous",
                               "--set", "backend.preset=toy", "--model-name", "local-model",
                               "--port", str(port), "--no-keep-alive"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
        run = subprocess.run([sys.executable, str(tmp_path / "loadtest.py")], capture_output=True,
                             text=True, timeout=120)
    finally:
        server.terminate()
        server.wait(10)
    assert run.returncode == 0, run.stderr
    levels = re.findall(r"conc=\s*(\d+)\s+p95=\s*([\d.]+)s\s+throughput=\s*([\d.]+) req/s", run.stdout)
    assert [int(c) for c, _, _ in levels] == [1, 4, 16, 64]
    assert all(float(t) > 0 for _, _, t in levels)
