"""What CodeBuild receives for one stack, read from a synthesized assembly, and its buildspec run here.

The source asset and the staged-sources asset are the directories `cdk synth` wrote (the CLI zips exactly
these), the environment is the project's, and the commands are the buildspec's `build` phase. Only what needs
AWS or China differs: no ECR (REPOSITORY_NAME empty: nothing is pushed, "exists" means a local image) and the
Debian mirror is one this machine reaches (TEST_DEBIAN_MIRROR); the roots, their pinned keyring and debootstrap,
the scripts and their arguments are the ones CodeBuild gets.
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

from tests.images.engine import engine_env

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


def build_env(inputs: BuildInputs, src: Path, stage: str) -> dict[str, str]:
    """The project's variables with what differs here on top: what CodeBuild itself sets (the source folders, STAGE
    from the custom resource), no ECR, and the mirror. Nothing else the build reads differs."""
    return {
        **inputs.env,
        "CODEBUILD_SRC_DIR": str(src),
        "CODEBUILD_SRC_DIR_sources": str(inputs.sources),
        "STAGE": stage,
        "REPOSITORY_URI": inputs.local_repository,
        "REPOSITORY_NAME": "",
        "DEBIAN_MIRROR": TEST_DEBIAN_MIRROR,
    }


def run_buildspec(inputs: BuildInputs, workdir: Path, *, stage: str = "all", log: Path | None = None) -> float:
    """Unpack the source asset as CodeBuild does and run the build phase; returns the seconds it took."""
    src = workdir / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(inputs.context, src, symlinks=True)
    env = {**engine_env(), **build_env(inputs, src, stage)}
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
    return time.monotonic() - started
