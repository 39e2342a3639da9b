"""A Docker engine for the image tier: Debian's docker.io, installed and started when missing, and the few tools
docker/bootstrap-base.sh needs on a builder (the same ones CodeBuild's image has; debootstrap itself is staged).

CI is a clean clone on a fresh machine, as root, with no engine; this is what findings.md verified there:
`dockerd --iptables=false` with overlay2. The engine is left running and its images (the bootstrapped roots,
the llama.cpp bases) stay in /var/lib/docker, outside the checkout: later runs reuse them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from gguf_serve.local.cache import cache_root
from tests.apt import apt_install

DOCKER = "/usr/bin/docker"  # Debian's client, which speaks to Debian's engine (another may be first on PATH)
CACHE = cache_root()


def docker(*args: str, check: bool = True, timeout: float = 600, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], check=check, capture_output=True, text=text, timeout=timeout)


def engine_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"/usr/bin:/usr/sbin:{os.environ.get('PATH', '')}", "DOCKER_BUILDKIT": "1"}


def ensure_engine() -> None:
    tools = {"docker.io": DOCKER, "wget": "wget", "binutils": "ar", "xz-utils": "xz", "gpgv": "gpgv", "perl": "perl"}
    missing = [p for p, exe in tools.items() if not shutil.which(exe, path="/usr/bin:/bin:/usr/sbin")]
    if missing:
        if os.geteuid() != 0:
            raise RuntimeError(f"the image tier needs {', '.join(missing)} (apt-get install) and root")
        apt_install(*missing)
    if docker("info", check=False, timeout=30).returncode == 0:
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    log = (CACHE / "dockerd.log").open("a")
    subprocess.Popen(
        [shutil.which("dockerd", path="/usr/sbin:/usr/bin") or "dockerd", "--iptables=false"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # outlives the test session: the next run finds it warm
    )
    deadline = time.monotonic() + 90
    while docker("info", check=False, timeout=30).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"dockerd did not start; see {CACHE / 'dockerd.log'}")
        time.sleep(1)


def ensure_arm64_emulation() -> None:
    """Run (never build) arm64 images here: Debian's qemu-user-static registered with binfmt_misc.

    Only the opt-in arm64 tier calls it, after the image is built: the build itself needs no emulator.
    """
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return
    if not Path("/usr/bin/qemu-aarch64-static").exists():
        apt_install("qemu-user-static", "binfmt-support")
    if not Path("/proc/sys/fs/binfmt_misc/register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"], check=True)
    subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=False, capture_output=True)
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        raise RuntimeError("qemu-aarch64 is not registered with binfmt_misc (update-binfmts --enable qemu-aarch64)")
