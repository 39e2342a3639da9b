"""The staged image sources: what the in-region build would otherwise download (the pinned llama.cpp sdist, the
runtime wheels, debootstrap), staged before deploy by scripts/stage-image-sources.sh into a folder outside the
checkout. Synth only reads and checks it; everything in it is pinned, so its asset hash is a digest of the pins."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

from gguf_serve.container.digest import sha256_file
from gguf_serve.local.cache import cache_root
from stacks.image_inputs import DOCKER


def default_sources_dir() -> Path:
    """Where scripts/stage-image-sources.sh stages the llama.cpp sdist and wheels (outside the checkout): one folder
    per set of pins, keyed as the script keys it, so checkouts with other pins do not stage over this one's."""
    dockerfile = (DOCKER / "x86-64-cpu.Dockerfile").read_text().splitlines(keepends=True)
    pins = [line for line in dockerfile if re.match(r"ARG LLAMA_CPP_PYTHON_(VERSION|SHA256)=", line)]
    h = hashlib.sha256("".join(pins).encode())
    for name in ("requirements-image.txt", "debian-sources.txt"):
        h.update((DOCKER / name).read_bytes())
    return cache_root() / "image-sources" / h.hexdigest()[:12]


class StagedSources:
    """The staged directory, a digest of its pinned contents (the asset hash), and what is wrong with it."""

    def __init__(self, path: Path, digest: str, problems: list[str]) -> None:
        self.path, self.digest, self.problems = path, digest, problems


def pinned_sources() -> dict[str, str]:
    """sha256 of each file the build needs from outside the region: the llama.cpp sdist, every wheel, debootstrap."""
    dockerfile = (DOCKER / "x86-64-cpu.Dockerfile").read_text()
    version = re.search(r"^ARG LLAMA_CPP_PYTHON_VERSION=(\S+)$", dockerfile, re.M).group(1)  # type: ignore[union-attr]
    sha = re.search(r"^ARG LLAMA_CPP_PYTHON_SHA256=([0-9a-f]{64})$", dockerfile, re.M).group(1)  # type: ignore[union-attr]
    pins = {f"llama_cpp_python-{version}.tar.gz": sha}
    for line in (DOCKER / "requirements-image.txt").read_text().splitlines():
        if m := re.match(r"^(\S+)==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)$", line):
            # One wheel per hash: a binary wheel has one per architecture (uvloop).
            for i, sha in enumerate(re.findall(r"[0-9a-f]{64}", m.group(3))):
                pins[f"wheels/{m.group(1)}=={m.group(2)}" + (f" ({i + 1})" if i else "")] = sha
    for line in (DOCKER / "debian-sources.txt").read_text().splitlines():
        if m := re.match(r"^\S+/(\S+\.deb) ([0-9a-f]{64})$", line):
            pins[f"debian/{m.group(1)}"] = m.group(2)
    return pins


def check_staged_sources(path: Path) -> StagedSources:
    """Everything staged is pinned, so the asset hash is a digest of the pins; nothing comes from this machine's OS."""
    pins = pinned_sources()
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()
    problems = []
    if not path.is_dir():
        problems = [f"{path} does not exist"]
    else:
        for name in (k for k in pins if not k.startswith("wheels/")):
            if _sha256(path / name) != pins[name]:
                problems.append(f"{path / name} is missing or not sha256 {pins[name]}")
        wheel_hashes = {_sha256(w) for w in (path / "wheels").glob("*.whl")}
        missing = sorted(k for k, v in pins.items() if k.startswith("wheels/") and v not in wheel_hashes)
        if missing:
            problems.append(f"{path / 'wheels'} lacks {', '.join(m.removeprefix('wheels/') for m in missing)}")
        problems += _sums_problems(path / "wheels")
    if problems:
        # Same template shape without them; `cdk deploy` refuses on the error annotation.
        return StagedSources(DOCKER / "unstaged", hashlib.sha256(b"unstaged").hexdigest(), problems)
    return StagedSources(path, digest, [])


def _sums_problems(wheels: Path) -> list[str]:
    """docker/build-image.sh checks the wheels with `sha256sum -c SHA256SUMS` before it unpacks them: synth requires
    the same file, naming every staged wheel with its hash, so a deploy never fails there after the base build."""
    sums = wheels / "SHA256SUMS"
    try:
        lines = sums.read_text().splitlines()
    except OSError:
        return [f"{sums} is missing"]
    listed = {}
    for line in lines:
        digest, _, name = line.partition("  ")
        listed[name.lstrip("*")] = digest
    wrong = sorted(w.name for w in wheels.glob("*.whl") if listed.get(w.name) != _sha256(w))
    return [f"{sums} does not match {', '.join(wrong)}"] if wrong else []


def _sha256(path: Path) -> str | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)
