"""Opt-in: the CUDA (g5, A10G) image built here from the synthesized GpuMtpStack assets, as CodeBuild builds it
(Debian non-free's CUDA 12.4 toolkit in the build root, libcudart12/libcublas12 in the runtime root, from the same
mirror), without a GPU. Its llama-server links every library but the driver's libcuda.so.1 and reports the CUDA
backend for sm_86. Long on 2 cores (nvcc): `.venv/bin/python -m pytest -m cuda
tests/images/test_cuda_image.py`. Cached by its inputs: the tags are the content keys, so a second run with the
same Dockerfile, roots and source reuses the image. `scripts/gpu-check.sh` runs this same image on a GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.images.buildspec import BuildInputs, build_inputs, run_buildspec
from tests.images.engine import CACHE, docker, ensure_engine

pytestmark = [pytest.mark.cuda, pytest.mark.slow, pytest.mark.timeout(4 * 3600)]  # opt-in: -m cuda
REPORT = CACHE / "image-tier"


@pytest.fixture(scope="module")
def cuda(image_assembly: Path, tmp_path_factory) -> BuildInputs:
    ensure_engine()
    inputs = build_inputs(image_assembly, "GpuMtpStack")
    work = tmp_path_factory.mktemp("codebuild")
    cold = docker("image", "inspect", inputs.base_image, check=False).returncode != 0
    base_s = run_buildspec(inputs, work, stage="base")
    app_s = run_buildspec(inputs, work, stage="app")
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / f"build-{'cold' if cold else 'warm'}-cuda.json").write_text(
        json.dumps({"base_seconds": round(base_s, 1), "app_seconds": round(app_s, 1), "image": inputs.image})
    )
    return inputs


def test_cuda_llama_server_links_everything_but_the_driver(cuda):
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "ldd", cuda.image, "/usr/local/bin/llama-server")
    missing = [line.split()[0] for line in out.stdout.splitlines() if "not found" in line]
    assert missing == ["libcuda.so.1"], out.stdout
    for library in ("libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12"):
        # merged /usr: the loader finds them through /lib, a link to /usr/lib
        assert re.search(rf"{re.escape(library)} => (/usr)?/lib/x86_64-linux-gnu/", out.stdout), out.stdout


def _stub(tmp_path: Path) -> Path:
    """The toolkit's libcuda stub, from the build root the base was compiled in (it is never in the image)."""
    roots = docker("images", "--format", "{{.Repository}}:{{.Tag}}", "gguf-serve-root/build-cuda").stdout.split()
    assert roots, "the CUDA build root was not bootstrapped"
    find = ["find", "/usr/lib", "-path", "*stubs*", "-name", "libcuda.so"]
    (path,) = docker("run", "--rm", "--network", "none", roots[0], *find).stdout.split()[:1]
    container = docker("create", roots[0], "true").stdout.strip()
    try:
        docker("cp", f"{container}:{path}", str(tmp_path / "libcuda.so.1"))
    finally:
        docker("rm", container, check=False)
    return tmp_path / "libcuda.so.1"


def test_cuda_backend_for_sm_86_without_a_gpu(cuda, tmp_path):
    """With the toolkit's stub for the driver, llama-server runs, initialises the CUDA runtime (which finds the stub,
    so no device) and its system info names the CUDA backend for sm_86. llama.cpp prints the system info at trace
    verbosity only, before it opens the model: `-lv 5` and a model that does not exist, as the arm64 tier does."""
    stub = _stub(tmp_path)
    run = ["run", "--rm", "--network", "none", "-v", f"{stub}:/stubs/libcuda.so.1:ro", "-e", "LD_LIBRARY_PATH=/stubs"]
    version = docker(*run, "--entrypoint", "llama-server", cuda.image, "--version", check=False)
    assert "(build 11312, commit 0c1e57098)" in version.stdout + version.stderr, version.stdout + version.stderr
    probe = docker(
        *run, "--entrypoint", "llama-server", cuda.image, "-lv", "5", "-m", "/nonexistent.gguf",
        check=False, timeout=180,
    )  # fmt: skip
    log = probe.stdout + probe.stderr
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "system-info-cuda.txt").write_text(log[-6000:])
    (info,) = re.findall(r"system_info:.*$", log, re.M)[:1] or [""]
    assert re.search(r"CUDA : ARCHS = 860\b", info), log[-3000:]
    # The runtime was loaded and asked for devices: the stub answers that it is one (ggml_cuda_init's error line).
    assert "ggml_cuda_init: failed to initialize CUDA" in log, log[-3000:]
