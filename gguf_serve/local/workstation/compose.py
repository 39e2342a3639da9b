"""`up` without --native: `docker compose -f observability/compose.yaml` with the workstation's folders."""

from __future__ import annotations

import os
import subprocess

from gguf_serve.local.workstation.native import OBSERVABILITY
from gguf_serve.local.workstation.prepare import Workdir, WorkstationError

COMPOSE_FILE = OBSERVABILITY / "compose.yaml"
DEFAULT_IMAGE = "gguf-serve:cuda-local"  # what scripts/gpu-check.sh GPU_CHECK_IMAGE=1 builds


def environment(work: Workdir, *, image: str, port: int, prometheus_port: int) -> dict[str, str]:
    """The variables compose.yaml reads (each `${...:?}` there names `gguf-serve-workstation up`)."""
    return {
        "GGUF_SERVE_CONFIG": str(work.config),
        "GGUF_SERVE_MODELS": str(work.models),
        "GGUF_SERVE_PROMETHEUS_DATA": str(work.prometheus),
        "GGUF_SERVE_UID": str(os.getuid()),
        "GGUF_SERVE_GID": str(os.getgid()),
        "GGUF_SERVE_IMAGE": image,
        "GGUF_SERVE_PORT": str(port),
        "PROMETHEUS_PORT": str(prometheus_port),
    }


def compose(args: list[str], env: dict[str, str]) -> int:
    cmd = ["docker", "compose", "-f", str(COMPOSE_FILE), *args]
    try:
        return subprocess.run(cmd, env={**os.environ, **env}, check=False).returncode
    except FileNotFoundError:
        raise WorkstationError("docker is not installed: install Docker Engine with the compose plugin") from None


def check_docker(image: str) -> None:
    try:
        ok = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0
        has_image = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    except FileNotFoundError:
        raise WorkstationError("docker is not installed: install Docker Engine, the compose plugin and the NVIDIA "
                               "container toolkit, or use --native") from None  # fmt: skip
    if not ok:
        raise WorkstationError("`docker compose` is missing: install the Docker compose plugin, or use --native")
    if has_image.returncode != 0:
        raise WorkstationError(
            f"no image {image}: build it with GPU_CHECK_IMAGE=1 BUILD_IMAGE=<an image with nvcc> "
            "scripts/gpu-check.sh (docker/build-image.sh), or pass --image"
        )
