"""The llama-server build says one line per stage, and where a stage fails, which one and where its output is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stacks.staged_sources import default_sources_dir
from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "build-llama-server.sh"
STAGED = default_sources_dir()


def test_a_failed_configure_names_the_stage_and_the_log_and_prints_only_its_tail(tmp_path):
    if not any(STAGED.glob("llama_cpp_python-*.tar.gz")):
        pytest.skip("needs the staged sdist (make image-sources)")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "image-sources").mkdir()
    (cache / "image-sources" / STAGED.name).symlink_to(STAGED)
    fake = tmp_path / "bin"
    fake.mkdir()
    # A cmake that writes 2,000 lines of compiler-like noise, then fails.
    (fake / "cmake").write_text('#!/bin/sh\nfor i in $(seq 2000); do echo "warning: noise $i"; done\nexit 1\n')
    (fake / "cmake").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "LLAMA_SERVER_CACHE": str(cache),
           "PYTHON": sys.executable}  # fmt: skip
    run = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False)
    log = cache / "llama-server-build.log"
    assert run.returncode == 1 and run.stdout == ""
    assert f"llama-server build: configure failed; the last lines of {log}:" in run.stderr
    assert len(run.stderr.splitlines()) <= 4 + 25  # the stage lines, the failure line, the log's tail
    assert "noise 2000" in run.stderr and "noise 1000\n" not in run.stderr
    assert log.read_text().count("warning: noise") == 2000
    assert not list(cache.glob("llama-server-*/bin/llama-server"))  # nothing that looks built
