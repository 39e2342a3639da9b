"""The x86-64 CPU image, built for real from the synthesized asset and run the way an instance runs it.

Build: the IntelMoeStack's source and staged-sources assets, its CodeBuild environment and its buildspec's
build phase (tests/images/buildspec.py): the same Debian roots, keyring, debootstrap, mirror probe, scripts and
arguments as CodeBuild, from a Debian mirror this machine reaches, with buildx as CodeBuild's images run it. Each
stage (roots, base, application) is its own run, as the three custom resources start them, and timed; each pushes
what it made to a real local registry (Debian's docker-registry) and the application stage pulls its base from
it, as the deploy does with ECR. Run: `launcher fetch` from a local ModelScope-shaped server, then `serve` as the
systemd unit does (non-root, key in the environment, model read-only, `-p`), `/health` 503 then 200, a chat
through the OpenAI client, the image's HEALTHCHECK healthy, and `docker stop` ending it cleanly.
Cold: about 15-25 minutes on 2 cores (the roots and the 14 CPU variants); warm: the base is reused.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_serve.catalog.images import BUILD_STAGES
from tests.images.buildspec import BuildInputs, build_inputs, run_buildspec
from tests.images.engine import CACHE, LocalRegistry, docker, ensure_engine
from tests.images.scenario import UID, run_as_the_instance_does

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]
REPORT = CACHE / "image-tier"


@pytest.fixture(scope="module")
def engine() -> None:
    ensure_engine()


@pytest.fixture(scope="module")
def registry(engine, tmp_path_factory) -> Iterator[LocalRegistry]:
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"))
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def x86(engine, registry: LocalRegistry, image_assembly: Path, tmp_path_factory) -> BuildInputs:
    inputs = build_inputs(image_assembly, "IntelMoeStack")
    work = tmp_path_factory.mktemp("codebuild")
    cold = docker("image", "inspect", inputs.base_image, check=False).returncode != 0
    seconds = {stage: run_buildspec(inputs, work, stage=stage, registry=registry) for stage in BUILD_STAGES}
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / f"build-{'cold' if cold else 'warm'}-x86-64-cpu.json").write_text(
        json.dumps(
            {f"{stage}_seconds": round(s, 1) for stage, s in seconds.items()}
            | {"image": inputs.image, "base": inputs.base_image}
        )  # fmt: skip
    )
    log = (work / "build.log").read_text()
    layers = _layers_built(log)
    unchecked = [layer.splitlines()[0] for layer in layers if not _self_checked(layer)]
    assert not unchecked, f"every layer built ran its self-check: {unchecked}"
    # Built by buildx (its docker driver announces itself), as CodeBuild's `docker build` is.
    assert log.count('building with "default" instance using docker driver') >= len(layers), log[-3000:]
    return inputs


def _layers_built(log: str) -> list[str]:
    """Each layer's part of the build log (a layer whose tag exists is not built again)."""
    return ["building " + part for part in log.split("build-image: building ")[1:]]


def _self_checked(layer: str) -> bool:
    """Its self-check ran and passed, or BuildKit reused that step (CACHED: the same check on the same inputs, run
    and passed before; BuildKit caches only steps that succeeded), as in a warm run whose base is rebuilt from the
    engine's cache for a registry that does not hold it yet."""
    if "selfcheck: ok" in layer:
        return True
    steps = re.findall(r"^#(\d+) \[[^\]]*\] RUN python3 /usr/local/bin/selfcheck ", layer, re.M)
    return bool(steps) and all(re.search(rf"^#{step} CACHED$", layer, re.M) for step in steps)


def test_each_stage_keeps_what_it_made_in_the_registry_and_the_app_pulls_its_base(x86, registry):
    repository = x86.local_repository
    pushed = registry.served("PUT", f"/v2/{repository}/manifests/")
    for tag in ("root-build-amd64-x86_64-", "root-runtime-amd64-x86_64-", x86.env["BASE_TAG"], x86.env["IMAGE_TAG"]):
        assert any(f"/manifests/{tag}" in line for line in pushed), (tag, pushed)
    # The application stage's `docker pull` asked the registry for its base by tag. Docker resolves a tag with HEAD
    # and GETs the manifest and layers only when that digest is not in the engine yet: a CodeBuild run (an empty
    # engine) or a cold tier shows the GET too, a warm tier (the base already in the shared engine) the HEAD alone.
    base = f"/v2/{repository}/manifests/{x86.env['BASE_TAG']}"
    answered = [line for m in ("HEAD", "GET") for line in registry.served(m, base) if '" 200 ' in line]
    asked = [line for line in answered if '"docker/' in line]  # the engine's pull, not the script's curl
    assert asked, registry.log.read_text()[-3000:]
    REPORT.joinpath("registry-x86-64-cpu.log").write_text("\n".join(pushed + asked) + "\n")


def _layers_gzip_bytes(image: str) -> list[int]:
    """Each layer's size gzip-compressed (what a registry stores and an instance pulls), in image order."""
    saved = docker("save", image, timeout=900, text=False).stdout
    sizes = []
    with tarfile.open(fileobj=io.BytesIO(saved)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            data = tar.extractfile(layer).read()  # type: ignore[union-attr]
            sizes.append(len(gzip.compress(data, compresslevel=6)))
    return sizes


def test_image_is_layered_small_and_runs_as_a_non_root_user(x86):
    config = json.loads(docker("image", "inspect", x86.image).stdout)[0]["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["python3", "-m", "gguf_serve.container.launch"] and config["Cmd"] == ["serve"]
    assert config["Healthcheck"]["Test"] == ["CMD", "python3", "-m", "gguf_serve.container.launch", "health"]
    image_layers = _layers_gzip_bytes(x86.image)
    base_layers = _layers_gzip_bytes(x86.base_image)
    assert image_layers[: len(base_layers)] == base_layers, "the application image is the base plus layers on top"
    app_bytes = sum(image_layers[len(base_layers) :])
    total = sum(image_layers)
    report = {
        "image": x86.image,
        "uncompressed_bytes": json.loads(docker("image", "inspect", x86.image).stdout)[0]["Size"],
        "compressed_bytes": total,
        "base_compressed_bytes": sum(base_layers),
        "app_layer_compressed_bytes": app_bytes,
    }
    (REPORT / "size-x86-64-cpu.json").write_text(json.dumps(report, indent=1))
    assert total <= 250e6, report  # issue 11's goal for a CPU image
    # An application change moves its own layer, not llama.cpp: 25.7 MB since uvloop's library joined it (15.7 MB
    # with its debug info, as the pinned wheel ships it; 4.3 MB of it compressed) cut the hop's CPU per token.
    assert app_bytes <= 30e6, report


def test_llama_server_in_the_image_is_the_pinned_build(x86):
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "llama-server", x86.image, "--version")
    assert "(build 11312, commit 0c1e57098)" in out.stdout + out.stderr


def test_fetch_then_serve_as_the_instance_does(x86, gemma_gguf, tmp_path):
    run_as_the_instance_does(x86.image, gemma_gguf, tmp_path)
