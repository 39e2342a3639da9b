"""Opt-in: the arm64 (Graviton4) image built from the synthesized GravitonMoeStack assets as the default in-region
builder does (cross-compiled on this x86 machine, no emulator), then run under QEMU the way an instance runs it,
with llama-server's system info showing the Neoverse V2 features it was compiled for. `make test-images-arm64`.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import pytest

from tests.images.buildspec import BuildInputs, build_inputs, run_buildspec
from tests.images.engine import CACHE, docker, ensure_arm64_emulation, ensure_engine
from tests.images.scenario import run_as_the_instance_does

pytestmark = [pytest.mark.arm64, pytest.mark.slow, pytest.mark.timeout(2 * 3600)]  # opt-in: make test-images-arm64
REPORT = CACHE / "image-tier"
# What -march=armv9-a+i8mm+bf16+fp16 compiles in, as llama.cpp's system info names it.
GRAVITON4_FEATURES = ("NEON = 1", "ARM_FMA = 1", "FP16_VA = 1", "MATMUL_INT8 = 1", "SVE = 1", "DOTPROD = 1")


@pytest.fixture(scope="module")
def arm64(image_assembly: Path, tmp_path_factory) -> BuildInputs:
    ensure_engine()
    inputs = build_inputs(image_assembly, "GravitonMoeStack")
    work = tmp_path_factory.mktemp("codebuild")
    emulator = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists()
    cold = docker("image", "inspect", inputs.base_image, check=False).returncode != 0
    seconds = run_buildspec(inputs, work)
    REPORT.mkdir(parents=True, exist_ok=True)
    log = (work / "build.log").read_text()
    (REPORT / f"build-{'cold' if cold else 'warm'}-arm64-cpu.json").write_text(
        json.dumps({"seconds": round(seconds, 1), "image": inputs.image, "emulator_registered": emulator})
    )
    if cold and not emulator:
        # Built with nothing able to run arm64 code: the self-check said so and checked statically.
        assert "does not run on this builder" in log, log[-3000:]
    return inputs


def test_arm64_image_is_arm64_and_its_llama_server_an_aarch64_elf(arm64, tmp_path):
    assert json.loads(docker("image", "inspect", arm64.image).stdout)[0]["Architecture"] == "arm64"
    container = docker("create", arm64.image).stdout.strip()
    try:
        docker("cp", f"{container}:/usr/local/bin/llama-server", str(tmp_path / "llama-server"))
    finally:
        docker("rm", container, check=False)
    header = (tmp_path / "llama-server").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64


def test_arm64_llama_server_reports_the_graviton4_features_under_emulation(arm64):
    """llama.cpp prints its system info at trace verbosity, before it opens the model."""
    ensure_arm64_emulation()
    out = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "llama-server", arm64.image,
        "-lv", "5", "-m", "/nonexistent.gguf", check=False, timeout=300,
    )  # fmt: skip
    (info,) = re.findall(r"system_info:.*$", out.stdout + out.stderr, re.M)[:1] or [""]
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "system-info-arm64-cpu.txt").write_text(info + "\n")
    for feature in GRAVITON4_FEATURES:
        assert feature in info, info


def test_arm64_image_serves_under_emulation(arm64, gemma_gguf, tmp_path):
    ensure_arm64_emulation()
    version = docker("run", "--rm", "--network", "none", "--entrypoint", "llama-server", arm64.image, "--version")
    assert "(build 11312, commit 0c1e57098)" in version.stdout + version.stderr
    emulated = platform.machine() != "aarch64"
    run_as_the_instance_does(arm64.image, gemma_gguf, tmp_path, target="arm64-cpu", load_timeout=900, emulated=emulated)
