"""The whole tree passes ruff (lint and format), the same as `make lint`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

RUFF = str(Path(sys.executable).parent / "ruff")


def test_ruff_check_is_clean():
    out = subprocess.run([RUFF, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_ruff_format_is_clean():
    out = subprocess.run([RUFF, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
