"""Writing a file so that a reader never sees half of it: a temp file beside it, fsync, rename.

A command killed mid-write (or a full disk) leaves the previous file whole, never a torn one;
an error names the file that could not be written (a failed write or fsync names none by itself).
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> None:
    """`path` holds `text` afterwards, or what it held before; a file already holding it is left alone."""
    path = Path(path)
    data = text.encode("utf-8")
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with naming(path), tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)              # a full disk leaves no half-written temp file behind (as git's lock files)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError from writing `path` names it."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        raise


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable."""
    if sys.platform == "win32":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
