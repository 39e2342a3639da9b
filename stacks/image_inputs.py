"""What goes into each image layer, and the tag that is a hash of it (stacks.image_build builds the layers).

- the llama.cpp base: its Dockerfile (source pin, flags), the roots' inputs, the source fetch, its build arguments;
- the application image: the base, docker/app.Dockerfile, the wheels, the build script, its check, and the runtime
  packages it copies whole. Profile fields the image never reads (prices, descriptions) are not among them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from gguf_serve.catalog.images import APP_DOCKERFILE, ImageTarget

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
# The source asset: Dockerfiles and build scripts, and what the image runs: the product package's `container`
# folder, copied whole, with the package's face that importing it reads. Nothing else of gguf_serve/ (the catalog,
# the pre-flight, the local tools) enters the image, so editing a profile, a price or a description rebuilds nothing.
PACKAGE = "gguf_serve"
IMAGE_CODE = (f"{PACKAGE}/__init__.py", f"{PACKAGE}/container")
# Anchored patterns: "*" alone would also match every file inside the re-included folders (an empty asset).
CONTEXT_EXCLUDE = [
    "/*",
    "!/docker/",
    f"!/{PACKAGE}/",
    f"/{PACKAGE}/*",
    *(f"!/{path}" + ("/" if not path.endswith(".py") else "") for path in IMAGE_CODE),
    "__pycache__/",
    "*.pyc",
]
# What a base image is made of besides its Dockerfile: the roots' bootstrap, the pinned keyring and debootstrap,
# the source fetch and the self-check (the mirror is not: every mirror serves the same signed release).
BASE_INPUTS = (
    "bootstrap-base.sh",
    "debian-sources.txt",
    "keyrings/debian-trixie.gpg",
    "fetch-llama-source.py",
    "selfcheck.py",
)


def declared_build_args(dockerfile: str, root: Path = ROOT) -> set[str]:
    """The ARG names a Dockerfile under docker/ declares."""
    return set(re.findall(r"^ARG ([A-Z][A-Z0-9_]*)", (root / "docker" / dockerfile).read_text(), re.M))


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def base_key(target: ImageTarget, args: dict[str, str], root: Path = ROOT) -> str:
    """llama.cpp base: its Dockerfile (source pin, flags), the roots' inputs, the source fetch, its arguments."""
    h = hashlib.sha256()
    for name in (target.dockerfile, *BASE_INPUTS):
        h.update(name.encode() + b"\0" + (root / "docker" / name).read_bytes() + b"\0")
    h.update(f"{target.platform}\0".encode())
    declared = declared_build_args(target.dockerfile, root)
    h.update(json.dumps({k: v for k, v in sorted(args.items()) if k in declared}).encode())
    return h.hexdigest()[:16]


def app_files(root: Path = ROOT) -> list[Path]:
    """The files the application layer copies: the container folder, whole, and the package's face."""
    return [
        path for entry in IMAGE_CODE for path in ([root / entry] if entry.endswith(".py") else _files(root / entry))
    ]


def app_key(base_tag: str, args: dict[str, str], root: Path = ROOT) -> str:
    """Application image: the base, the app Dockerfile, the wheels, the build script, its check, the files it copies."""
    h = hashlib.sha256(base_tag.encode() + b"\0")
    for name in (APP_DOCKERFILE, "requirements-image.txt", "build-image.sh", "selfcheck.py"):
        h.update(name.encode() + b"\0" + (root / "docker" / name).read_bytes() + b"\0")
    for path in app_files(root):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    declared = declared_build_args(APP_DOCKERFILE, root)
    h.update(json.dumps({k: v for k, v in sorted(args.items()) if k in declared}).encode())
    return h.hexdigest()[:16]
