"""What CodeBuild receives for one stack, read from a synthesized assembly, and its buildspec run here.

The source asset and the staged-sources asset are the directories `cdk synth` wrote (the CLI zips exactly
these), the environment is the project's, and the commands are the buildspec's `build` phase, run with buildx
(tests/images/engine.py ensure_buildx) as CodeBuild's images run `docker build`. Only what needs AWS or China
differs: a local registry instead of ECR (REGISTRY_API: every stage pushes there and the application layer pulls
its base from it; without one, nothing is pushed and "exists" means a local image) and the Debian mirrors are one
this machine reaches (TEST_DEBIAN_MIRROR); the roots, their pinned keyring and debootstrap, the mirror probe, the
scripts and their arguments are the ones CodeBuild gets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.images.engine import LocalRegistry, docker, engine_env, ensure_buildx

# The deploy's default mirror is inside mainland China; this machine reaches Debian's own.
TEST_DEBIAN_MIRROR = os.environ.get("GGUF_SERVE_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class BuildInputs:
    context: Path  # the source asset directory
    sources: Path  # the staged-sources asset directory
    env: dict[str, str]  # the project's plain environment variables
    commands: list[str]  # the buildspec's build phase
    project: dict

    @property
    def image(self) -> str:
        return f"{self.local_repository}:{self.env['IMAGE_TAG']}"

    @property
    def base_image(self) -> str:
        return f"{self.local_repository}:{self.env['BASE_TAG']}"

    @property
    def local_repository(self) -> str:
        return f"gguf-serve-test/{self.env['TARGET']}"


def build_inputs(assembly_dir: Path, stack_name: str) -> BuildInputs:
    template = json.loads((assembly_dir / f"{stack_name}.template.json").read_text())
    (project,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]

    def asset_dir(location: dict) -> Path:
        key = json.dumps(location)
        (digest,) = re.findall(r"/([0-9a-f]{64})\.zip", key)
        return assembly_dir / f"asset.{digest}"

    (secondary,) = project["SecondarySources"]
    env = {v["Name"]: v["Value"] for v in project["Environment"]["EnvironmentVariables"] if isinstance(v["Value"], str)}
    spec = json.loads(project["Source"]["BuildSpec"])
    return BuildInputs(
        context=asset_dir(project["Source"]["Location"]),
        sources=asset_dir(secondary["Location"]),
        env=env,
        commands=spec["phases"]["build"]["commands"],
        project=project,
    )


def build_env(inputs: BuildInputs, src: Path, stage: str, registry: LocalRegistry | None = None) -> dict[str, str]:
    """The project's variables with what differs here on top: what CodeBuild itself sets (the source folders, STAGE
    from the custom resource), the registry, and the mirror. Nothing else the build reads differs."""
    return {
        **inputs.env,
        "CODEBUILD_SRC_DIR": str(src),
        "CODEBUILD_SRC_DIR_sources": str(inputs.sources),
        "STAGE": stage,
        "REPOSITORY_URI": f"{registry.host}/{inputs.local_repository}" if registry else inputs.local_repository,
        "REPOSITORY_NAME": "",
        "REGISTRY_API": registry.url if registry else "",
        "DEBIAN_MIRRORS": TEST_DEBIAN_MIRROR,
        "DOCKER_CONFIG": str(ensure_buildx()),
    }


def run_buildspec(
    inputs: BuildInputs,
    workdir: Path,
    *,
    stage: str = "all",
    log: Path | None = None,
    registry: LocalRegistry | None = None,
) -> float:
    """Unpack the source asset as CodeBuild does and run the build phase; returns the seconds it took. With a
    registry, what the stage made is also tagged under the local names (inputs.image, inputs.base_image)."""
    src = workdir / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(inputs.context, src, symlinks=True)
    env = {**engine_env(), **build_env(inputs, src, stage, registry)}
    started = time.monotonic()
    with (log or workdir / "build.log").open("a") as out:
        for command in inputs.commands:
            subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=src,
                env=env,
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    seconds = time.monotonic() - started
    if registry is not None:
        tags = {"base": ["BASE_TAG"], "app": ["IMAGE_TAG"], "all": ["BASE_TAG", "IMAGE_TAG"]}.get(stage, [])
        for tag in (inputs.env[t] for t in tags):
            docker("tag", f"{registry.host}/{inputs.local_repository}:{tag}", f"{inputs.local_repository}:{tag}")
    return seconds
