"""Command line: `batchlab run`, `batchlab report`, and the commands later modules add.

click gives the parsing and help; every user mistake (ConfigError, a bad argument) ends in one
line on stderr and exit status 2, never a traceback. Subcommands that need torch or a web
server import them only when invoked, so the simulator path stays light.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_user_config

# Commands defined in other modules, imported only when invoked (they may need torch or a
# web stack). name -> "module:attribute" of a click command.
LAZY_COMMANDS = {
    "serve": "batchlab.server.app:serve_cmd",
    "loadtest": "batchlab.baselines.loadtest:loadtest_cmd",
    "vllm": "batchlab.baselines.vllm:vllm_cmd",
    "profile": "batchlab.calibrate.profile:profile_cmd",
    "validate": "batchlab.calibrate.validate:validate_cmd",
    "tune": "batchlab.tune.command:tune_cmd",
    "capacity": "batchlab.tune.capacity_cmd:capacity_cmd",
    "size": "batchlab.tune.size_cmd:size_cmd",
    "compare": "batchlab.report.compare_cmd:compare_cmd",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx, name):
        if name in self.commands or name not in LAZY_COMMANDS:
            return super().get_command(ctx, name)
        module, attr = LAZY_COMMANDS[name].split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:
            reason = f"`batchlab {name}` is not available here ({e}); install the extras: pip install 'batchlab[hf,serve]'"

            @click.command(name, help=f"(unavailable: {e})", context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def unavailable(args):
                click.echo(f"error: {reason}", err=True)
                sys.exit(2)
            return unavailable


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """batchlab: which batching policy holds my latency target at my traffic?"""


@main.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--out", "out", default=None,
              help="Output directory, holding one experiment (default: the config's `out`, results/latest). "
                   "A path named `latest` is a link to a directory per experiment, <name>-<digest>, beside it.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. --set traffic.rates=[5,10] (repeatable).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where points run (the config's executor.kind; default local): ray runs each point as a Ray task, "
                   "on $RAY_ADDRESS or executor.address if set, else on a Ray started here.")
@user_errors
def run(config: str | None, out: str | None, overrides: tuple[str, ...], quiet: bool, executor: str | None) -> None:
    """Run a sweep (default: the simulator, naive/dynamic/continuous at 5, 20, 50 req/s)."""
    from batchlab.report.console import run_with_progress

    cfg = load_user_config(config, overrides + ((f"executor.kind={executor}",) if executor else ()))
    out_dir = Path(out or cfg.out)
    run_with_progress(cfg, out_dir, quiet=quiet)


@main.command()
@click.argument("results_dir", type=click.Path(file_okay=False))
@user_errors
def report(results_dir: str) -> None:
    """Regenerate report.md and the plots from a results directory's CSV files (points that are
    not intact, incomplete or changed since they were written, are left out with a warning saying
    which: the next run reruns them)."""
    from batchlab.report.console import report_dir
    report_dir(Path(results_dir))


@main.command("make-tiny-model")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--seed", default=0, show_default=True, help="Seed for the corpus and the weights.")
@click.option("--vocab-size", default=3000, show_default=True, help="BPE vocabulary size.")
@user_errors
def make_tiny_model(directory: str, seed: int, vocab_size: int) -> None:
    """Build a tiny random Llama + byte-level BPE tokenizer in DIRECTORY (offline, seconds)."""
    if vocab_size < 300:
        raise ConfigError(f"--vocab-size must be at least 300 (got {vocab_size})")
    try:
        from batchlab.backends.tiny import TinySpec
        from batchlab.backends.tiny import make_tiny_model as build
    except ImportError as e:
        raise ConfigError(f"make-tiny-model needs the 'hf' extra (pip install 'batchlab[hf]'): {e}") from None
    out = build(directory, TinySpec(vocab_size=vocab_size, seed=seed))
    n = sum(f.stat().st_size for f in out.iterdir())
    click.echo(f"tiny model written to {out} ({n / 1e6:.1f} MB); use it with backend.model: {out}")


if __name__ == "__main__":
    main()
