"""Opt-in: the arm64 (Graviton4) image built under QEMU on this x86 machine, as the default in-region builder
does, then run under emulation the way an instance runs it. Over an hour on 2 cores: `make test-images-arm64`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.images.buildspec import build_inputs, run_buildspec
from tests.images.engine import CACHE, docker, ensure_engine
from tests.images.scenario import run_as_the_instance_does

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(3 * 3600),
    pytest.mark.skipif(os.environ.get("GGUF_SERVE_ARM64_TIER") != "1", reason="opt-in: make test-images-arm64"),
]


def test_arm64_image_builds_under_emulation_and_serves(image_assembly: Path, gemma_gguf, tmp_path):
    ensure_engine()
    inputs = build_inputs(image_assembly, "GravitonMoeStack")
    cold = docker("image", "inspect", inputs.base_image, check=False).returncode != 0
    seconds = run_buildspec(inputs, tmp_path)
    report = CACHE / "image-tier"
    report.mkdir(parents=True, exist_ok=True)
    (report / f"build-{'cold' if cold else 'warm'}-arm64-cpu.json").write_text(
        json.dumps({"seconds": round(seconds, 1), "image": inputs.image})
    )
    arch = json.loads(docker("image", "inspect", inputs.image).stdout)[0]["Architecture"]
    assert arch == "arm64"
    version = docker("run", "--rm", "--network", "none", "--entrypoint", "llama-server", inputs.image, "--version")
    assert "(build 11312, commit 0c1e57098)" in version.stdout + version.stderr
    run_as_the_instance_does(inputs.image, gemma_gguf, tmp_path, target="arm64-cpu", load_timeout=900)
