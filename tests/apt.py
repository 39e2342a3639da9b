"""Debian packages a test tier installs for itself (as root, from the package registry CI reaches)."""

from __future__ import annotations

import os
import subprocess


def apt_install(*packages: str, recommends: bool = True) -> None:
    """`apt-get update` then `apt-get install -y` the packages, non-interactively; raises on failure."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
    extra = [] if recommends else ["--no-install-recommends"]
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *extra, *packages], check=True, env=env, capture_output=True, timeout=900
    )
