"""User errors: the one exception type a person is meant to read, and how commands show it.

A `ConfigError` carries a message written for the user (the key, the value, what to do). Every
command wraps its body in `user_errors`, which prints that message as one line on stderr and
exits with status 2: never a traceback for a mistake in the input.
This module is the bottom layer: it imports nothing else of batchlab.
"""
from __future__ import annotations

import functools
import sys
import warnings

import click


class ConfigError(ValueError):
    """A user mistake in a config file, an override, a flag or an input file; shown as is."""


class RunFailed(RuntimeError):
    """Work that could not be finished although the input was fine (a Ray worker that kept dying);
    what did finish is saved. Shown as one line, exit status 1."""


def user_errors(fn):
    """Turn user mistakes into one clear line and exit status 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConfigError, FileNotFoundError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except RunFailed as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except OSError as e:
            # NOTE: not the user's input (that is checked before anything is written) but the machine:
            # a disk that filled up, a directory removed under a running sweep. One line, exit 1.
            click.echo(f"error: {e.strerror or e} ({e.filename or 'no file named'}); what was written before is "
                       "intact: rerun the same command once this is fixed (a sweep resumes where it stopped)", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted: finished points are saved; rerun the same command to resume", err=True)
            _quiet_teardown()
            sys.exit(130)
    return wrapper


def _quiet_teardown() -> None:
    """Keep the interrupted command's output to its one line.

    Ctrl-C can land inside `asyncio.run` while it builds its event loop; the half-built loop and the
    coroutine it never started are collected at exit, and Python reports each as 'Exception ignored'
    and 'never awaited' on stderr. Both are harmless (nothing was running), so they are not shown."""
    sys.unraisablehook = lambda _unraisable: None
    warnings.simplefilter("ignore")
