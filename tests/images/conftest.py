"""Fixtures for the image tier: the staged sources and one synthesized assembly, built the way `cdk synth` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest

from stacks.app import build_app
from tests.conftest import ROOT, cdk_context


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
def image_app(staged_sources: Path) -> cdk.App:
    return build_app(cdk_context())


@pytest.fixture(scope="session")
def image_assembly(image_app: cdk.App) -> Path:
    return Path(image_app.synth().directory)
