"""Command line: `batchlab run`, `batchlab report`, and the commands later modules add.

click gives the parsing and help; every user mistake (ConfigError, a bad argument) ends in one
line on stderr and exit status 2, never a traceback. Subcommands that need torch or a web
server import them only when invoked, so the simulator path stays light.
"""
from __future__ import annotations

import functools
import importlib
import sys
from importlib import resources
from pathlib import Path

import click

from batchlab.core.config import ConfigError, load_config


def user_errors(fn):
    """Turn user mistakes into one clear line and exit status 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConfigError, FileNotFoundError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted: finished points are saved; rerun the same command to resume", err=True)
            sys.exit(130)
    return wrapper


# Commands defined in other modules, imported only when invoked (they may need torch or a
# web stack). name -> "module:attribute" of a click command.
LAZY_COMMANDS = {
    "make-tiny-model": "batchlab.backends.tiny:make_tiny_model_cmd",
    "serve": "batchlab.server.app:serve_cmd",
    "loadtest": "batchlab.baselines.loadtest:loadtest_cmd",
    "vllm": "batchlab.baselines.vllm:vllm_cmd",
    "profile": "batchlab.calibrate.profile:profile_cmd",
    "validate": "batchlab.calibrate.validate:validate_cmd",
    "tune": "batchlab.tune.search:tune_cmd",
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


def default_config_text() -> str:
    return resources.files("batchlab").joinpath("data/default.yaml").read_text()


@main.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--out", "out", default=None, help="Output directory (default: the config's `out`).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. --set traffic.rates=[5,10] (repeatable).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@user_errors
def run(config: str | None, out: str | None, overrides: tuple[str, ...], quiet: bool) -> None:
    """Run a sweep (default: the simulator, naive/dynamic/continuous at 5, 20, 50 req/s)."""
    import yaml
    from batchlab.report.console import run_with_progress

    base = None if config else yaml.safe_load(default_config_text())
    cfg = load_config(config, list(overrides), base=base)
    out_dir = Path(out or cfg.out)
    run_with_progress(cfg, out_dir, quiet=quiet)


@main.command()
@click.argument("results_dir", type=click.Path(file_okay=False))
@user_errors
def report(results_dir: str) -> None:
    """Regenerate report.md and the plots from a results directory's CSV files."""
    from batchlab.report.console import write_report
    write_report(Path(results_dir))


if __name__ == "__main__":
    main()
