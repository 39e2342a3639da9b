"""The workstation's files: runtime spec and API key (GGUF_SERVE_CONFIG), the model (GGUF_SERVE_MODELS), and
the fetch through the launcher, as an instance does it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gguf_serve.catalog.profiles import ServingProfile
from gguf_serve.container.names import API_KEY_ENV, RUNTIME_SPEC_PATH
from gguf_serve.local.cache import cache_root
from gguf_serve.local.process import PACKAGE_ROOT

SPEC_NAME = Path(RUNTIME_SPEC_PATH).name  # runtime.json: mounted at names.CONFIG_DIR in the server container


class WorkstationError(RuntimeError):
    """One line saying what to change."""


@dataclass(frozen=True)
class Workdir:
    root: Path

    @classmethod
    def default(cls, profile: str) -> Workdir:
        return cls(cache_root() / "workstation" / profile)

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def spec(self) -> Path:
        return self.config / SPEC_NAME

    @property
    def api_key_file(self) -> Path:
        return self.config / "api-key"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def prometheus(self) -> Path:
        return self.root / "prometheus"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def write_config(profile: ServingProfile, work: Workdir) -> str:
    """runtime.json (0644: the server container's user reads it), api-key (0600) and api.env; returns the key.
    The key is made once and kept, so clients and Prometheus keep working across restarts."""
    for d in (work.config, work.models, work.prometheus, work.logs):
        d.mkdir(parents=True, exist_ok=True)
    work.config.chmod(0o755)
    # hex: a key never starts with "-", which `bench smoke --api-key KEY` would read as an option
    key = work.api_key_file.read_text().strip() if work.api_key_file.is_file() else secrets.token_hex(32)
    _write(work.api_key_file, key, 0o600)
    _write(work.config / "api.env", f"{API_KEY_ENV}={key}\n", 0o600)
    _write(work.spec, profile.runtime_json(), 0o644)
    return key


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def fetch(work: Workdir, endpoint: str | None) -> None:
    """`gguf-serve-launch fetch`: the instances' fetcher (ranged, resumable, sha256-checked when pinned)."""
    cmd = [
        sys.executable,
        "-m",
        "gguf_serve.container.launch",
        "fetch",
        "--spec",
        str(work.spec),
        "--model-dir",
        str(work.models),
    ]
    if endpoint:
        cmd += ["--endpoint", endpoint]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    if subprocess.run(cmd, env=env, check=False).returncode != 0:
        raise WorkstationError("the model fetch failed (its line above says why); run the same command to resume")


def gpu_memory_gib(nvidia_smi: str = "nvidia-smi") -> list[float]:
    """memory.total of each GPU as the driver reports it, in GiB; [] when there is no driver."""
    try:
        out = subprocess.run([nvidia_smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(line) / 1024 for line in out.split() if line.strip().isdigit()]


def check_card(profile: ServingProfile) -> None:
    """Refuse a GPU profile on a machine whose first GPU has less memory than the profile's card."""
    found = gpu_memory_gib()
    if not found:
        raise WorkstationError(
            f"no NVIDIA driver here (nvidia-smi did not answer): profile {profile.name!r} needs "
            f"{profile.hardware.gpu}; pass --cpu to run it on the CPU (slow), or run it on the GPU machine"
        )
    want = profile.hardware.gpu_memory_gib
    if found[0] + 0.05 < want:
        raise WorkstationError(
            f"this GPU reports {found[0]:.2f} GiB but profile {profile.name!r} is planned for "
            f"{profile.hardware.gpu} ({want:.2f} GiB); pick the profile of your card (gguf-serve-workstation check)"
        )
