"""The one GGUF SageMaker copied under /opt/ml/model, checked against the runtime spec's pin before llama-server runs.

The stack stages the locked file under a prefix of its own (stacks/sagemaker/staging.py), so SageMaker writes
exactly one file there, below the path the model cache gives it (<owner>/<repo>/<revision>/<file>). A second file,
a missing one, another size or another sha256 is refused with what was found: a wrong file is never served.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gguf_serve.container.digest import sha256_file
from gguf_serve.container.launch.preflight import LaunchRefused, check_model
from gguf_serve.container.spec import RuntimeSpec


def find_model(root: Path) -> Path:
    """The single file under `root` (any depth); a refusal naming what is there otherwise."""
    if not root.is_dir():
        raise LaunchRefused(
            f"{root} does not exist: the SageMaker model needs ModelDataSource (S3Prefix, CompressionType None) "
            "pointing at the staged GGUF's prefix"
        )
    files = sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())
    if len(files) != 1:
        found = ", ".join(str(p.relative_to(root)) for p in files[:5]) or "nothing"
        raise LaunchRefused(
            f"{root} must hold exactly one file, the locked GGUF; found {len(files)} ({found}): point the model's "
            "S3 prefix at the staged object's own prefix"
        )
    return files[0]


def verify_model(spec: RuntimeSpec, root: Path, *, log=print) -> Path:
    """The GGUF under `root` after checking it is the spec's file: name, size, header, then every byte's sha256."""
    model = spec.model
    if model.sha256 is None:
        raise LaunchRefused(
            f"profile {spec.name!r} pins no sha256 for {model.file}: SageMaker serves locked files only"
        )
    path = find_model(root)
    if path.name != model.local_name:
        raise LaunchRefused(f"{path} is not {model.local_name} ({model.repo}/{model.file}); stage the locked file")
    if not os.access(path, os.R_OK):
        st = path.stat()
        raise LaunchRefused(
            f"{path} is not readable by uid {os.getuid()} (owner {st.st_uid}, mode {st.st_mode & 0o777:o}): "
            "the container runs as the image's user"
        )
    check_model(spec, path.parent)  # size against the pin, GGUF header against the profile (architecture, MTP)
    started = time.monotonic()
    digest = sha256_file(path)
    took = time.monotonic() - started
    if digest != model.sha256:
        raise LaunchRefused(
            f"{path} has sha256 {digest}, but {model.name} is locked at {model.sha256}: a different or damaged "
            "file; stage it again (the staging custom resource verifies what it uploads)"
        )
    mib_s = model.size_bytes / (1024 * 1024) / took if took > 0 else 0.0
    log(f"{path.name} matches the lock (sha256 {digest[:12]}..., {took:.1f} s, {mib_s:.0f} MiB/s)")
    return path
