"""TEST DATA: a model lock whose Qwen3.6-27B entry the real lock step wrote against localscope.

The real 27B MTP file cannot be read here (no route to ModelScope), so localscope serves a stand-in under its
repo and file name: the tiny random qwen35 GGUF with one MTP layer (rehearsal/tiny_mtp.py). The lock step reads
its listing and header over loopback exactly as it would ModelScope's. Only tests use this lock (`-c
modelLock=<file>`), to synthesize GpuMtpStack as if the 27B had been locked; the committed lock stays typed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from catalog.lock import lock_model
from catalog.lockfile import read_lock, write_lock
from localscope.server import LocalScope

ROOT = Path(__file__).resolve().parent.parent.parent
REPO, FILE = "unsloth/Qwen3.6-27B-MTP-GGUF", "Qwen3.6-27B-Q4_K_M.gguf"


def stand_in_lock(folder: Path) -> Path:
    from rehearsal.tiny_mtp import write

    gguf = write(folder / "tiny-mtp.gguf")
    entries = read_lock(ROOT / "profiles" / "models.lock.toml")
    with LocalScope() as hub:
        hub.add_file(REPO, FILE, gguf)
        locked = lock_model("Qwen3.6-27B", repo=REPO, file=FILE, endpoint=hub.url).entry
    entries["Qwen3.6-27B"] = replace(locked, source="TEST DATA: a tiny stand-in served by localscope (tests/catalog)")
    lock = folder / "models.lock.toml"
    write_lock(lock, entries)
    return lock
