"""Small files beside the model (marker, resume state, lock) that a planted symlink cannot redirect.

`--dest` may be shared or prepared by someone else: every open here refuses to follow a symlink, and writes go
to a fresh temporary file renamed over the name (a rename replaces a planted link, it never writes through it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def read_text(path: Path) -> str:
    """The file's text; OSError (ELOOP) when `path` is a symlink."""
    fd = os.open(path, os.O_RDONLY | NOFOLLOW | CLOEXEC)
    with os.fdopen(fd, "r", encoding="utf-8") as f:
        return f.read()


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically, never writing through a link at `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open that refuses a symlink at `path` (OSError ELOOP)."""
    return os.open(path, flags | NOFOLLOW | CLOEXEC, mode)
