"""Fixtures for the image tier: the staged sources and the committed options' synthesized assembly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def staged_sources() -> Path:
    """The llama.cpp sdist and wheels staged outside the checkout (what `make image-sources` does)."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "stage-image-sources.sh")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def image_assembly(staged_sources: Path, whole_apps) -> Path:
    """The committed options' cloud assembly, the one the fast tier shares (tests/whole_app.py)."""
    return whole_apps["committed"].directory
