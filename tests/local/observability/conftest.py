"""Prometheus and promtool from Debian's `prometheus` package, installed by this tier when missing (as root)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.apt import apt_install

ROOT = Path(__file__).resolve().parents[3]
OBSERVABILITY = ROOT / "gguf_serve" / "local" / "workstation" / "observability"


def _install_prometheus() -> None:
    if os.geteuid() != 0:
        raise RuntimeError("this tier needs promtool and prometheus: apt-get install prometheus (or run as root)")
    apt_install("prometheus", recommends=False)


@pytest.fixture(scope="session")
def prometheus_bin() -> dict[str, Path]:
    """{'prometheus': path, 'promtool': path} (Debian bookworm: Prometheus 2.42)."""
    found = {name: shutil.which(name, path="/usr/bin:/usr/local/bin") for name in ("prometheus", "promtool")}
    if not all(found.values()):
        _install_prometheus()
        found = {name: shutil.which(name, path="/usr/bin:/usr/local/bin") for name in ("prometheus", "promtool")}
    assert all(found.values()), found
    return {name: Path(p) for name, p in found.items() if p}
