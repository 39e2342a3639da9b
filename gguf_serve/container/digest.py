"""The one way to hash a file: sha256 hex digest, streamed by hashlib.file_digest (no whole-file read)."""

from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
