"""What CodeBuild receives and how the build is keyed, checked in the synthesized assembly (no Docker engine).

Each test here failed on the image build as it stood before the China-native supply chain (issue 11; issue 9
items 4, 5 and the build-argument half of 10).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from gguf_serve.catalog.images import (
    BUILD_POLL_INTERVAL_S,
    CUSTOM_RESOURCE_MAX_WAIT_S,
    DEFAULT_DEBIAN_MIRRORS,
    IMAGE_TARGETS,
    LAYER_BUILD_TIMEOUT_MIN,
)
from gguf_serve.errors import InputError
from stacks.app import build_app
from stacks.image_build import (
    ImageBuild,
    app_files,
    app_key,
    base_key,
    pinned_sources,
)
from tests.committed import PROFILES
from tests.conftest import ROOT, cdk_context
from tests.images.buildspec import build_env, build_inputs
from tests.whole_app import MIRROR_IMAGE, OPTION_SETS

STACKS = [p.stack_name for p in PROFILES.values()]
X86 = IMAGE_TARGETS["x86-64-cpu"]


def _files(folder: Path) -> set[str]:
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.mark.parametrize("stack", STACKS)
def test_source_asset_holds_exactly_the_build_context(image_assembly, stack):
    """The directory the CDK CLI zips for CodeBuild: docker/ and the runtime packages, nothing else."""
    inputs = build_inputs(image_assembly, stack)
    expected = {f"docker/{f}" for f in _files(ROOT / "docker")}
    expected |= {p.relative_to(ROOT).as_posix() for p in app_files()}
    got = _files(inputs.context)
    assert got == expected
    # No catalog at all: the runtime package carries the spec's loader; no profile, hardware or price.
    assert not {n for n in got if n.startswith("gguf_serve/catalog/")}
    for needed in (
        "docker/build-image.sh",
        f"docker/{X86.dockerfile}",
        "docker/app.Dockerfile",
        "gguf_serve/container/launch/cli.py",
    ):
        assert needed in got
    for name in got:
        assert (inputs.context / name).read_bytes() == (ROOT / name).read_bytes(), name


@pytest.mark.parametrize("stack", STACKS)
def test_staged_sources_asset_holds_the_pinned_llama_cpp_source_and_wheels(image_assembly, stack):
    import hashlib

    inputs = build_inputs(image_assembly, stack)
    hashes = {
        str(p.relative_to(inputs.sources)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in inputs.sources.rglob("*")
        if p.is_file()
    }
    for name, sha in pinned_sources().items():
        if name.startswith("wheels/"):
            assert sha in {v for k, v in hashes.items() if k.startswith("wheels/")}, name
        else:
            assert hashes.get(name) == sha, name


def test_unstaged_sources_are_a_synth_error_that_says_what_to_run(tmp_path):
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="cn-northwest-1"))
    ImageBuild(stack, "Image", target=X86, sources_dir=tmp_path / "nothing-here")
    with pytest.raises(
        RuntimeError, match=r"sources are not staged: .*nothing-here does not exist.*make image-sources"
    ):
        app.synth()


@pytest.mark.parametrize("damage", ["missing", "stale"])
def test_synth_requires_the_wheels_sha256sums_the_build_checks(staged_sources, tmp_path, damage):
    from stacks.staged_sources import check_staged_sources

    copy = tmp_path / "sources"
    shutil.copytree(staged_sources, copy)
    assert check_staged_sources(copy).problems == []
    sums = copy / "wheels" / "SHA256SUMS"
    if damage == "missing":
        sums.unlink()
    else:
        sums.write_text(sums.read_text().replace("boto3", "boto4"))
    (problem,) = check_staged_sources(copy).problems
    assert "SHA256SUMS" in problem and (damage == "missing" or "boto3" in problem)


def test_the_buildspec_runs_the_build_script_and_never_splits_build_arguments(image_assembly):
    inputs = build_inputs(image_assembly, "IntelMoeStack")
    assert inputs.commands == ['SOURCES_DIR="$CODEBUILD_SRC_DIR_sources" bash docker/build-image.sh']
    assert "$BUILD_ARGS" not in json.dumps(inputs.project["Source"]["BuildSpec"])
    assert inputs.project["SecondarySources"][0]["SourceIdentifier"] == "sources"


# --- the default build reaches nothing outside the region --------------------------------------------------


@pytest.mark.parametrize("dockerfile", sorted((ROOT / "docker").glob("*.Dockerfile")), ids=lambda p: p.name)
def test_no_dockerfile_defaults_to_a_public_registry_or_index(dockerfile):
    text = dockerfile.read_text()
    for public in ("docker.io", "ghcr.io", "nvcr.io", "huggingface", "pypi.org", "quay.io", "gcr.io"):
        assert public not in text, f"{dockerfile.name} defaults to {public}"
    for line in re.findall(r"^ARG \w+_IMAGE=(\S*)$", text, re.M):
        assert line.startswith("gguf-serve-root/") or "${" in line, line
    assert not re.search(r"apt-get|dnf |yum |pip install|curl |wget ", text), (
        "packages come from the bootstrapped roots"
    )


def test_build_script_builds_without_network_unless_a_mirror_is_asked_for():
    script = (ROOT / "docker" / "build-image.sh").read_text()
    # Every build goes through build(): buildx where installed (as CodeBuild's images run it), else docker build.
    assert script.count('build --network "$network"') == 1 and "local network=none" in script
    assert script.count("build --network none") == 2  # the application layer's check, then the image
    assert script.count("docker buildx build --load") == 1 and script.count("docker build ") == 1


# --- issue 9 item 4: the build role, immutable tags and rollbacks -------------------------------------------


def _policies(template: dict, role_fragment: str) -> list[dict]:
    return [
        s
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy" and any(role_fragment in json.dumps(x) for x in r["Properties"]["Roles"])
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]


def _actions(statement: dict) -> list[str]:
    a = statement["Action"]
    return [a] if isinstance(a, str) else a


@pytest.mark.parametrize("stack", STACKS)
def test_build_role_and_start_handler_can_see_which_tags_exist(image_assembly, stack):
    template = json.loads((image_assembly / f"{stack}.template.json").read_text())
    for role in ("ImageProjectRole", "ImageStartHandlerServiceRole"):
        statements = [s for s in _policies(template, role) if "ecr:DescribeImages" in _actions(s)]
        assert statements, f"{role} lacks ecr:DescribeImages"
        assert all("ImageRepository" in json.dumps(s["Resource"]) for s in statements)


def test_a_base_image_in_another_ecr_repository_can_be_pulled(whole_apps):
    """-c imageBuildArgs=RUNTIME_IMAGE=<ECR mirror> (in the whole-app set that names build arguments)."""
    assert f"RUNTIME_IMAGE={MIRROR_IMAGE}" in OPTION_SETS["ningxia-from-zero"]["imageBuildArgs"]
    template = whole_apps["ningxia-from-zero"].template("IntelMoeStack")
    pulls = [s for s in _policies(template, "ImageProjectRole") if "ecr:BatchGetImage" in _actions(s)]
    text = json.dumps(pulls)
    assert "123456789012" in text and "repository/mirror/qwen36-runtime" in text
    assert "arn:aws:" not in text


def test_start_handler_skips_a_tag_that_is_already_in_ecr(monkeypatch):
    """A rollback updates the custom resource back to the previous tag: nothing is built, nothing pushed."""
    import boto3
    from moto import mock_aws

    from stacks.handlers import image_build_start

    monkeypatch.setenv("AWS_DEFAULT_REGION", "cn-northwest-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ecr = boto3.client("ecr")
        ecr.create_repository(repositoryName="serving", imageTagMutability="IMMUTABLE")
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"digest": "sha256:" + "0" * 64},
                "layers": [],
            }
        )
        ecr.put_image(repositoryName="serving", imageManifest=manifest, imageTag="x86-64-cpu-0123456789abcdef")
        event = {
            "RequestType": "Update",
            "PhysicalResourceId": "x86-64-cpu-fedcba9876543210",
            "ResourceProperties": {
                "ProjectName": "no-such-project",  # a StartBuild would fail: it must not be called
                "RepositoryName": "serving",
                "ImageTag": "x86-64-cpu-0123456789abcdef",
                "Stage": "app",
            },
        }
        result = image_build_start.handler(event, None)
    assert result == {"PhysicalResourceId": "x86-64-cpu-0123456789abcdef", "Data": {"BuildId": ""}}

    from stacks.handlers import build_is_complete

    assert build_is_complete.handler({"RequestType": "Update", "Data": result["Data"]}, None) == {"IsComplete": True}


# --- issue 9 item 5: CloudFormation waits at most an hour for a custom resource -----------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_every_wait_fits_inside_cloudformations_custom_resource_limit(image_assembly, stack):
    template = json.loads((image_assembly / f"{stack}.template.json").read_text())
    resources = template["Resources"].values()
    customs = [r for r in resources if r["Type"] == "AWS::CloudFormation::CustomResource"]
    assert len(customs) == 3  # the roots, the base and the application layer, each with its own hour
    for r in customs:
        assert r["Properties"]["ServiceTimeout"] == CUSTOM_RESOURCE_MAX_WAIT_S <= 3600
    (machine,) = [r for r in resources if r["Type"] == "AWS::StepFunctions::StateMachine"]
    definition = json.dumps(machine["Properties"]["DefinitionString"]).replace('\\"', '"')
    interval = int(re.search(r'"IntervalSeconds":\s*(\d+)', definition).group(1))
    attempts = int(re.search(r'"MaxAttempts":\s*(\d+)', definition).group(1))
    waiter = interval * attempts
    assert interval == BUILD_POLL_INTERVAL_S
    assert waiter < CUSTOM_RESOURCE_MAX_WAIT_S, "the waiter must report before CloudFormation gives up silently"
    (project,) = [r for r in resources if r["Type"] == "AWS::CodeBuild::Project"]
    build_s = project["Properties"]["TimeoutInMinutes"] * 60
    assert build_s == LAYER_BUILD_TIMEOUT_MIN * 60
    assert build_s + interval <= waiter, "a build that times out is seen failing before the waiter gives up"


# --- issue 9 item 10: build arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple --network=host", "spaces"),
        ("PIP_INDEX_URL=https://mirror/simple;rm -rf /", "spaces"),
        ("PIP_INDEX_URL=https://mirror/$(id)", "without spaces"),
        ("BASE_IMAGE=123456789012.dkr.ecr.cn-northwest-1.amazonaws.com.cn/mirror/ubuntu:24.04", "use one of"),
        ("pip_index_url=https://mirror/simple", "upper case"),
        ("PIP_INDEX_URL=http://mirror/simple", "https://"),
        ("RUNTIME_IMAGE=not an image", "spaces"),
        ("RUNTIME_IMAGE=UPPER/case", "image reference"),
        ("LLAMA_BASE=evil/base:1", "use one of"),
    ],
)
def test_bad_build_arguments_are_refused_at_synth_with_what_to_change(value, message):
    with pytest.raises(InputError, match=re.escape(message)):
        build_app({**cdk_context(), "imageBuildArgs": value}, stack_names=["IntelMoeStack"])


def test_good_build_arguments_reach_the_build_intact(whole_apps):
    assert OPTION_SETS["ningxia-from-zero"]["imageBuildArgs"] == (
        f"PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple,LLAMA_CPP_BUILD=11312,RUNTIME_IMAGE={MIRROR_IMAGE}"
    )
    template = whole_apps["ningxia-from-zero"].template("IntelMoeStack")
    (project,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]
    env = {v["Name"]: v["Value"] for v in project["Properties"]["Environment"]["EnvironmentVariables"]}
    assert env["BUILD_ARGS"] == (
        f"LLAMA_CPP_BUILD=11312 PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple RUNTIME_IMAGE={MIRROR_IMAGE}"
    )


def test_build_script_refuses_a_pair_that_would_become_a_docker_option(tmp_path):
    """Even past synth, the script passes each pair quoted and refuses one that is not NAME=value."""
    env = {
        "PATH": "/usr/bin:/bin",
        "TARGET": "x86-64-cpu",
        "PLATFORM": "linux/amd64",
        "BASE_TAG": "b",
        "IMAGE_TAG": "i",
        "REPOSITORY_URI": "r",
        "SOURCES_DIR": str(tmp_path),
        "BUILD_ARGS": "PIP_INDEX_URL=https://m/simple --network=host",
    }
    out = subprocess.run(
        ["bash", str(ROOT / "docker" / "build-image.sh")], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2 and "refusing build argument '--network=host'" in out.stderr


# --- issue 11: layered images keyed by their own inputs -----------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for folder in ("docker", "gguf_serve", "profiles"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _keys(root: Path) -> tuple[str, str]:
    base = f"base-x86-64-cpu-{base_key(X86, {}, root)}"
    return base, app_key(base, {}, root)


def _edit(path: Path, pattern: str, replacement: str) -> None:
    text = path.read_text()
    new, n = re.subn(pattern, replacement, text, count=1)
    assert n == 1, f"{pattern!r} not found in {path}"
    path.write_text(new)


def test_price_and_description_edits_leave_both_tags_unchanged(tree):
    before = _keys(tree)
    _edit(tree / "profiles" / "hardware.toml", r"ri_1yr_all_upfront_cny = \d+", "ri_1yr_all_upfront_cny = 1")
    serving = sorted((tree / "profiles" / "serving").glob("*.toml"))[0]
    _edit(serving, r'description = "[^"]*"', 'description = "cheaper now"')
    _edit(
        tree / "gguf_serve" / "catalog" / "profiles.py", r'^"""[^\n]*', '"""A new module docstring."""'
    )  # not in the image
    assert _keys(tree) == before


def test_local_tools_and_the_preflight_are_not_in_the_image(tree):
    """Only gguf_serve/container/ (and the package face) is hashed: a demo, bench, hub or pre-flight edit rebuilds
    nothing, and a module added to the container folder is in the image with no list to update."""
    before = _keys(tree)
    for path in ("local/demo.py", "local/bench/cli.py", "local/hub/server.py", "preflight/checks.py"):
        _edit(tree / "gguf_serve" / path, r"\n", "\n# changed\n")
    assert _keys(tree) == before
    (tree / "gguf_serve" / "container" / "new_module.py").write_text("VALUE = 1\n")
    assert _keys(tree)[0] == before[0] and _keys(tree)[1] != before[1]


def test_a_runtime_change_rebuilds_only_the_application_layer(tree):
    base, app = _keys(tree)
    _edit(tree / "gguf_serve" / "container" / "launch" / "cli.py", r"\n", "\n# changed\n")
    new_base, new_app = _keys(tree)
    assert new_base == base and new_app != app
    _edit(tree / "gguf_serve" / "container" / "spec.py", r"\n", "\n# changed\n")  # the loader the container runs
    assert _keys(tree)[0] == base and _keys(tree)[1] != new_app


def test_a_llama_cpp_bump_rebuilds_its_base(tree):
    base, app = _keys(tree)
    arm = base_key(IMAGE_TARGETS["arm64-cpu"], {}, tree)
    _edit(tree / "docker" / X86.dockerfile, r"ARG LLAMA_CPP_BUILD=\d+", "ARG LLAMA_CPP_BUILD=11313")
    new_base, new_app = _keys(tree)
    assert new_base != base and new_app != app  # the application layer is rebuilt on the new base: a COPY
    assert base_key(IMAGE_TARGETS["arm64-cpu"], {}, tree) == arm  # other targets keep theirs
    assert app_key(base, {}, tree) == app  # and the application inputs alone did not change


def test_the_synthesized_tags_are_the_keys(image_assembly):
    inputs = build_inputs(image_assembly, "IntelMoeStack")
    assert inputs.env["BASE_TAG"] == f"base-x86-64-cpu-{base_key(X86, {})}"
    assert inputs.env["IMAGE_TAG"] == f"x86-64-cpu-{app_key(inputs.env['BASE_TAG'], {})}"


# --- issue 11: an arm64 path wherever CodeBuild is -----------------------------------------------------------


def _environment(template: dict) -> dict:
    (project,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]
    return project["Properties"]["Environment"]


def test_graviton_image_is_cross_compiled_on_the_x86_builder_by_default(image_assembly):
    template = json.loads((image_assembly / "GravitonMoeStack.template.json").read_text())
    env = _environment(template)
    assert env["Type"] == "LINUX_CONTAINER" and env["PrivilegedMode"] is True  # docker build, the roots' chroot
    variables = {v["Name"]: v["Value"] for v in env["EnvironmentVariables"]}
    assert variables["PLATFORM"] == "linux/arm64"
    inputs = build_inputs(image_assembly, "GravitonMoeStack")
    assert not list(inputs.sources.rglob("qemu*")), "nothing of the deploy machine's OS is staged"
    for name in ("docker/build-image.sh", "docker/bootstrap-base.sh", "docker/arm64-cpu.Dockerfile"):
        text = (inputs.context / name).read_text()
        assert "qemu" not in text and "binfmt" not in text, name
    dockerfile = (inputs.context / "docker" / "arm64-cpu.Dockerfile").read_text()
    assert "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++" in dockerfile
    assert "g++-${arch/arm64/aarch64}-linux-gnu" in (inputs.context / "docker" / "bootstrap-base.sh").read_text()


def test_native_arm64_builder_where_the_region_offers_it(staged_sources):
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="cn-northwest-1"))
    ImageBuild(stack, "Image", target=IMAGE_TARGETS["arm64-cpu"], arm64_builder="native")
    env = _environment(Template.from_stack(stack).to_json())
    assert env["Type"] == "ARM_CONTAINER"
    with pytest.raises(InputError, match="use one of cross, native"):
        ImageBuild(stack, "Other", target=IMAGE_TARGETS["arm64-cpu"], arm64_builder="emulated")


def test_staging_and_synth_without_any_emulator_give_a_deployable_graviton_stack(staged_sources, tmp_path):
    """A deploy machine without qemu-aarch64-static (macOS, WSL, arm64 Linux) stages and synthesizes every stack."""
    # A PATH with every command but the emulators: a folder that holds qemu-* is replaced by a copy of it
    # (symlinks) without them, so that bash, curl and the rest are still found (qemu-user-static is in /usr/bin).
    dirs = []
    for i, d in enumerate(os.environ["PATH"].split(os.pathsep)):
        if d and (Path(d) / "qemu-aarch64-static").exists():
            shadow = tmp_path / f"path{i}"
            shadow.mkdir()
            for entry in Path(d).iterdir():
                if not entry.name.startswith("qemu-"):
                    (shadow / entry.name).symlink_to(entry)
            d = str(shadow)
        dirs.append(d)
    path = os.pathsep.join(dirs)
    assert shutil.which("qemu-aarch64-static", path=path) is None and shutil.which("bash", path=path)
    cache = tmp_path / "cache"
    shutil.copytree(staged_sources, cache / "image-sources")  # no download: staging finds its pins in place
    (cache / "image-sources" / "qemu").mkdir()  # what an older staging left behind
    (cache / "image-sources" / "qemu" / "qemu-aarch64-static").write_bytes(b"\x7fELF")
    out = subprocess.run(
        [str(ROOT / "scripts" / "stage-image-sources.sh")],
        env={**os.environ, "PATH": path, "LLAMA_SERVER_CACHE": str(cache), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    staged = Path(out.stdout.strip().splitlines()[-1])
    assert not (staged / "qemu").exists()
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "GravitonMoeStack", env=cdk.Environment(region="cn-northwest-1"))
    ImageBuild(stack, "Image", target=IMAGE_TARGETS["arm64-cpu"], sources_dir=staged)
    assembly = app.synth()  # raises on an error annotation, which would make `cdk deploy` refuse
    inputs = build_inputs(Path(assembly.directory), "GravitonMoeStack")
    assert (
        _environment(json.loads((Path(assembly.directory) / "GravitonMoeStack.template.json").read_text()))["Type"]
        == "LINUX_CONTAINER"
    )
    assert {p.relative_to(inputs.sources).as_posix() for p in inputs.sources.rglob("*") if p.is_file()} >= {
        "debian/debootstrap_1.0.141_all.deb",
        "llama_cpp_python-0.3.36.tar.gz",
    }


# --- issue 19: one recipe, from a Debian mirror, checked against a pinned keyring ------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_every_build_bootstraps_its_roots_from_the_debian_mirror_option(image_assembly, stack):
    inputs = build_inputs(image_assembly, stack)
    assert inputs.env["DEBIAN_MIRRORS"] == " ".join(DEFAULT_DEBIAN_MIRRORS)
    assert "ROOTFS_FLAVOR" not in inputs.env
    assert (inputs.context / "docker" / "keyrings" / "debian-trixie.gpg").read_bytes() == (
        ROOT / "docker" / "keyrings" / "debian-trixie.gpg"
    ).read_bytes()
    script = (inputs.context / "docker" / "bootstrap-base.sh").read_text()
    assert '--keyring="$keyring"' in script and "dnf" not in script and "al2023" not in script


def test_the_gpu_stack_pulls_no_image_from_another_registry(image_assembly):
    """The CUDA toolkit and libraries come from Debian non-free through the same mirror, not a registry image."""
    template = json.loads((image_assembly / "GpuMtpStack.template.json").read_text())
    pulls = [s for s in _policies(template, "ImageProjectRole") if "ecr:BatchGetImage" in _actions(s)]
    assert all("ImageRepository" in json.dumps(s["Resource"]) for s in pulls), pulls
    env = {v["Name"]: v["Value"] for v in _environment(template)["EnvironmentVariables"]}
    assert "BUILD_IMAGE" not in env["BUILD_ARGS"]


@pytest.mark.parametrize(
    "mirror",
    ["ftp://mirror/debian", "https://mirror/debian --no-check-gpg", "https://mirror/$(id)", "mirror.example/debian"],
)
def test_a_mirror_the_build_could_misread_is_refused(mirror):
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="cn-northwest-1"))
    with pytest.raises(InputError, match="debianMirrors"):
        ImageBuild(stack, "Image", target=X86, debian_mirrors=(DEFAULT_DEBIAN_MIRRORS[0], mirror))


def test_a_mirror_reaches_the_build_and_leaves_the_tags_alone(staged_sources):
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="cn-northwest-1"))
    default = ImageBuild(stack, "Default", target=X86)
    other = ImageBuild(stack, "Other", target=X86, debian_mirrors=("http://mirrors.tuna.tsinghua.edu.cn/debian/",))
    assert (default.base_tag, default.image_tag) == (other.base_tag, other.image_tag)  # the same signed release
    envs = [
        {v["Name"]: v["Value"] for v in r["Properties"]["Environment"]["EnvironmentVariables"]}
        for r in Template.from_stack(stack).to_json()["Resources"].values()
        if r["Type"] == "AWS::CodeBuild::Project"
    ]
    assert sorted(e["DEBIAN_MIRRORS"] for e in envs) == sorted(
        [" ".join(DEFAULT_DEBIAN_MIRRORS), "http://mirrors.tuna.tsinghua.edu.cn/debian"]
    )


def test_the_debian_mirror_option_reaches_every_build_from_the_cli_context(whole_apps):
    mirrors = "http://mirrors.ustc.edu.cn/debian,https://mirrors.aliyun.com/debian"
    assert OPTION_SETS["ningxia-from-zero"]["debianMirrors"] == mirrors
    for stack in ("IntelMoeStack", "GravitonMoeStack", "GpuMtpStack"):
        env = _environment(whole_apps["ningxia-from-zero"].template(stack))
        variables = {v["Name"]: v["Value"] for v in env["EnvironmentVariables"]}
        assert variables["DEBIAN_MIRRORS"] == mirrors.replace(",", " "), stack
    with pytest.raises(InputError, match=r"debianMirrors \(from -c\): 'mirror' is not a mirror URL"):
        build_app({**cdk_context(), "debianMirrors": "mirror"})
    with pytest.raises(InputError, match=r"-c debianMirror is now debianMirrors"):
        build_app({**cdk_context(), "debianMirror": "http://mirrors.ustc.edu.cn/debian"})


def test_the_image_tier_runs_the_projects_build_with_only_the_mirror_and_ecr_differing(image_assembly, tmp_path):
    """Same script, same arguments: the tier changes no variable the project sets except these."""
    for stack in STACKS:
        inputs = build_inputs(image_assembly, stack)
        env = build_env(inputs, tmp_path, "base")
        changed = {k for k, v in inputs.env.items() if env[k] != v}
        assert changed <= {"REPOSITORY_URI", "REPOSITORY_NAME", "DEBIAN_MIRRORS", "STAGE"}, changed
        # CodeBuild's own, the repository (a CloudFormation reference in the project, not a plain value), the local
        # registry standing in for ECR, and the buildx plugin (CodeBuild's image has it installed)
        added = {"CODEBUILD_SRC_DIR", "CODEBUILD_SRC_DIR_sources", "REPOSITORY_URI", "REPOSITORY_NAME", "REGISTRY_API",
                 "DOCKER_CONFIG"}  # fmt: skip
        assert set(env) - set(inputs.env) <= added
