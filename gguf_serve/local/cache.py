"""This machine's cache of what takes minutes to make (models, test data): one root, and entries that appear whole
or not at all.

An entry is made under a temporary name in its own folder and renamed into place under an exclusive lock: a
concurrent maker waits for the first and takes its entry, a reader never sees a half-written one, and a maker that
was killed leaves only a temporary name, which the next maker removes. The llama-server build and the staged image
sources follow the same rule in shell (scripts/).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from gguf_serve.container import names


def cache_root() -> Path:
    """$LLAMA_SERVER_CACHE, else $XDG_CACHE_HOME/gguf-serve, else ~/.cache/gguf-serve (the Makefile sets the first)."""
    explicit = os.environ.get("LLAMA_SERVER_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / names.LOCAL_CACHE


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def cached(path: Path, make: Callable[[Path], object], valid: Callable[[Path], bool] | None = None) -> Path:
    """`path`, made once by `make(temporary)`: a file or a folder `make` writes at the temporary path it is given.

    `valid` rejects an entry left by an older layout or a changed producer; it is made again.
    """
    if path.exists() and (valid is None or valid(path)):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and (valid is None or valid(path)):
            return path
        for stale in path.parent.glob(f".{path.name}.tmp-*"):  # a killed maker's; nobody else makes it now
            _remove(stale)
        if path.exists():
            _remove(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            make(tmp)
            if not tmp.exists():
                raise RuntimeError(f"making {path} wrote nothing at {tmp}")
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                _remove(tmp)
    return path
