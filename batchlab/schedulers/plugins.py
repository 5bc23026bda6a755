"""Policies of your own: found by import path or by entry point, and checked before anything runs.

`strategies: [mypkg.policies:ShortestPromptFirst]` imports the module (the working directory is
on the path, as `uvicorn app:app` does) and takes the class; a bare name not built in is looked
up in the `batchlab.schedulers` entry-point group of the installed packages. Either way the
class must subclass `Scheduler`; it is built with its `from_config` classmethod (the built-in
bases provide one) and runs behind `Guarded` (schedulers/guard.py), which holds it to the contract.
"""
from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from importlib.metadata import entry_points

from batchlab.core.config import one_line
from batchlab.errors import ConfigError
from batchlab.schedulers.base import Scheduler

GROUP = "batchlab.schedulers"
HOWTO = ("a policy of your own is named by import path 'pkg.module:Class' or by an entry point in the "
         f"'{GROUP}' group (README: Bring your own scheduler)")


def load_policy(name: str, builtin: Iterable[str] = ()) -> type[Scheduler]:
    """The Scheduler subclass `name` names; ConfigError (one line) if it cannot be had.
    `builtin`: the registered names, for the message when `name` is none of them."""
    if ":" in name:
        module, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            raise ConfigError(f"strategies: policy '{name}': no module named '{e.name}'") from None
        except AttributeError:
            raise ConfigError(f"strategies: policy '{name}': module '{module}' has no '{attr}'") from None
        except (Exception, SystemExit) as e:   # the module's own code failed (or exited) as it was imported
            raise ConfigError(one_line(f"strategies: policy '{name}': importing '{module}' raised "
                                       f"{type(e).__name__}: {e}")) from None
    else:
        found = entry_points(group=GROUP, name=name)
        if not found:
            raise ConfigError(f"strategies: unknown strategy '{name}' (built in: {', '.join(builtin)}; "
                              f"{HOWTO})")
        ep = next(iter(found))
        try:
            obj = ep.load()
        except (Exception, SystemExit) as e:
            raise ConfigError(one_line(f"strategies: entry point '{name}' ({ep.value}) could not be loaded: "
                                       f"{type(e).__name__}: {e}")) from None
    if not (isinstance(obj, type) and issubclass(obj, Scheduler)):
        raise ConfigError(f"strategies: policy '{name}' is not a subclass of batchlab.schedulers.Scheduler "
                          "(subclass ContinuousScheduler to reorder admissions; README: Bring your own scheduler)")
    if getattr(obj, "level", None) not in ("request", "iteration"):
        raise ConfigError(f"strategies: policy '{name}' must set level = 'request' or 'iteration'")
    return obj
