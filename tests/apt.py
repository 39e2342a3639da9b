"""Debian packages a test tier installs for itself (as root, from the package registry CI reaches)."""

from __future__ import annotations

import os
import subprocess


def apt_install(*packages: str, recommends: bool = True) -> None:
    """`apt-get update` then `apt-get install -y` the packages, non-interactively; raises on failure."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=600"]  # another tier or process installing at the same time: wait for it
    subprocess.run(["apt-get", *wait, "update", "-qq"], check=True, env=env, capture_output=True, timeout=900)
    extra = [] if recommends else ["--no-install-recommends"]
    subprocess.run(
        ["apt-get", *wait, "install", "-y", "-qq", *extra, *packages],
        check=True, env=env, capture_output=True, timeout=1500,
    )  # fmt: skip
