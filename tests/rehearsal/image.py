"""The fake instance's image, built once by tests/rehearsal/files/build-instance.sh and keyed by its inputs."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from tests.apt import apt_install
from tests.images.engine import CACHE, docker, engine_env

FILES = Path(__file__).parent / "files"
STATE = CACHE / "rehearsal"
REPOSITORY = "gguf-serve-rehearsal/instance"


def instance_image() -> str:
    """Build (first run, a few minutes) or reuse the fake instance's image; returns its tag."""
    from tests.rehearsal.tls import ensure_ca

    ca_cert, _ = ensure_ca(STATE / "ca")
    digest = hashlib.sha256(ca_cert.read_bytes())
    for path in sorted(FILES.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    tag = f"{REPOSITORY}:{digest.hexdigest()[:16]}"
    if docker("image", "inspect", tag, check=False).returncode == 0:
        return tag
    old = docker("images", "--format", "{{.Repository}}:{{.Tag}}", REPOSITORY).stdout.split()
    if old:  # an earlier recipe's image; containers of a running rehearsal keep theirs
        docker("rmi", *old, check=False)
    if not shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin"):  # the tier installs what it needs
        apt_install("debootstrap")
    log = STATE / "build-instance.log"
    with log.open("w") as out:
        subprocess.run(
            [str(FILES / "build-instance.sh"), tag, str(ca_cert)],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**engine_env(), "PYTHON": sys.executable},
            timeout=1800,
        )
    return tag


if __name__ == "__main__":
    print(instance_image())
