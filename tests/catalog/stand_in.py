"""TEST DATA: a model lock whose Qwen3.6-27B entry synth's own lookup wrote against localscope.

The real 27B MTP file cannot be read here (no route to ModelScope), so the local hub serves a stand-in under its
repo and file name: the tiny random qwen35 GGUF with one MTP layer (tests/rehearsal/tiny_mtp.py), extended with zeros
(a sparse file, no disk used) to the catalog's planning size of the 27B, so that the stacks keep the volume and
boot budget they plan for the real file. Its sha256 is the real hash of those bytes, kept beside it for localscope:
a pure function of the tiny model's bytes and the size, so it is looked up in KNOWN_SHA256 by those two and
computed (16.8 GB of sha256, 12-25 s of one core here: it held up the fast tier's first synthesis) only when they
change; tests/setup/test_cache_producers.py recomputes it from the file in the fresh tier. The lock is written by
gguf_serve.catalog.lookup.resolve_locks, the function `cdk synth` runs for an unlocked model, reading the listing and
the header over loopback exactly as it would ModelScope's. Tests synthesize with it (`-c modelLock=<file>`, lookups
off so no test reaches for a hub); the committed lock stays typed until someone with ModelScope access synthesizes
or runs `gguf-serve-catalog lock`.
"""

from __future__ import annotations

from pathlib import Path

from gguf_serve.catalog.lockfile import read_lock
from gguf_serve.container.digest import sha256_file
from gguf_serve.local.cache import cache_root, cached
from gguf_serve.local.hub.server import LocalScope

ROOT = Path(__file__).resolve().parent.parent.parent
REPO, FILE = "unsloth/Qwen3.6-27B-MTP-GGUF", "Qwen3.6-27B-Q4_K_M.gguf"

# (sha256 of the tiny model's bytes, size of the stand-in) -> sha256 of the stand-in; recomputed and compared with the
# file's own hash by the fresh tier (a stale entry fails there, and a changed tiny model misses it and hashes).
KNOWN_SHA256 = {
    ("0db814d4da283ef61662f9634eaa9855564a21222deb40672a6c8c367a9dd4d4", 16_800_000_000): (
        "65d8586a1b79dd0c66e296944c75c9ed15cc2228ef573dd32a43d68e681ff071"
    ),
}


def stand_in_gguf(cache: Path | None = None) -> Path:
    """The stand-in file with its `<file>.sha256` beside it, in a cache folder that appears whole or not at all (two
    pytest-xdist workers once built it in place at once, and one served it half-written: "bad magic")."""
    from tests.rehearsal.tiny_mtp import write

    size = read_lock(ROOT / "profiles" / "models.lock.toml")["Qwen3.6-27B"].size_bytes

    def make(folder: Path) -> None:
        folder.mkdir()
        path = write(folder / FILE)
        tiny = sha256_file(path)
        with path.open("r+b") as f:
            f.truncate(size)  # zeros after the tiny model's tensors: never read by the lock or the header check
        digest = KNOWN_SHA256.get((tiny, size)) or sha256_file(path)
        (folder / f"{FILE}.sha256").write_text(digest + "\n")

    return cached((cache or cache_root()) / "test-data" / f"stand-in-{size}.v2", make) / FILE


def stand_in_lock(folder: Path) -> Path:
    """The committed lock, copied to `folder`, after synth's lookup locked the 27B from localscope."""
    import shutil

    from gguf_serve.catalog.lookup import resolve_locks

    gguf = stand_in_gguf()
    lock = folder / "models.lock.toml"
    shutil.copyfile(ROOT / "profiles" / "models.lock.toml", lock)
    with LocalScope() as hub:
        hub.add_file(REPO, FILE, gguf)
        resolution = resolve_locks(["Qwen3.6-27B"], root=ROOT / "profiles", lock_file=lock, endpoint=hub.url)
    assert list(resolution.locked) == ["Qwen3.6-27B"], resolution
    return lock
