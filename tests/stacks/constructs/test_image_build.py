"""ImageBuild alone: the repository, the CodeBuild project, the two layer builds, and its prop checks."""

from __future__ import annotations

import re

import pytest
from aws_cdk.assertions import Match, Template

from gguf_serve.catalog.images import IMAGE_TARGETS
from stacks.errors import PropsError
from stacks.image_build import ImageBuild

X86, ARM = IMAGE_TARGETS["x86-64-cpu"], IMAGE_TARGETS["arm64-cpu"]


def _env(t: Template) -> dict[str, str]:
    (project,) = t.find_resources("AWS::CodeBuild::Project").values()
    return {v["Name"]: v["Value"] for v in project["Properties"]["Environment"]["EnvironmentVariables"]}


def _env_of(t: Template, construct_id: str) -> dict[str, str]:
    projects = [p for k, p in t.find_resources("AWS::CodeBuild::Project").items() if k.startswith(construct_id)]
    (project,) = projects
    return {v["Name"]: v["Value"] for v in project["Properties"]["Environment"]["EnvironmentVariables"]}


def test_three_stages_each_tagged_by_its_inputs(regional_stack):
    image = ImageBuild(regional_stack, "Image", target=X86)
    t = Template.from_stack(regional_stack)
    assert re.fullmatch(r"base-x86-64-cpu-[0-9a-f]{16}", image.base_tag)
    assert re.fullmatch(r"x86-64-cpu-[0-9a-f]{16}", image.image_tag)
    t.has_resource_properties(
        "AWS::ECR::Repository",
        {"ImageTagMutability": "IMMUTABLE", "ImageScanningConfiguration": {"ScanOnPush": True}},
    )
    t.has_resource_properties(
        "AWS::CodeBuild::Project",
        {"Environment": Match.object_like({"PrivilegedMode": True, "ComputeType": "BUILD_GENERAL1_LARGE"})},
    )
    env = _env(t)
    assert (env["TARGET"], env["PLATFORM"]) == ("x86-64-cpu", "linux/amd64")
    assert (env["BASE_TAG"], env["IMAGE_TAG"]) == (image.base_tag, image.image_tag)
    builds = t.find_resources("AWS::CloudFormation::CustomResource")
    stages = sorted((b["Properties"]["Stage"], b["Properties"]["ImageTag"]) for b in builds.values())
    # The roots stage skips itself once the base exists (its roots are then never needed again).
    assert stages == [("app", image.image_tag), ("base", image.base_tag), ("roots", image.base_tag)]
    assert {b["Properties"]["ComputeType"] for b in builds.values()} == {"BUILD_GENERAL1_LARGE"}
    order = {b["Properties"]["Stage"]: set(b.get("DependsOn", [])) for b in builds.values()}
    ids = {b["Properties"]["Stage"]: k for k, b in builds.items()}
    assert ids["roots"] in order["base"] and ids["base"] in order["app"]
    assert {b["Properties"]["ServiceTimeout"] for b in builds.values()} == {3600}


def test_unstaged_sources_are_an_error_annotation_not_an_exception(regional_stack, tmp_path):
    """`cdk deploy` of this stack refuses on the annotation; synth of the others still works."""
    image = ImageBuild(regional_stack, "Image", target=X86, sources_dir=tmp_path / "absent")
    errors = [str(m.data) for m in image.node.metadata if m.type == "aws:cdk:error"]
    assert len(errors) == 1 and "does not exist" in errors[0] and "make image-sources" in errors[0]


@pytest.mark.parametrize(("builder", "image"), [("cross", "aws/codebuild/amazonlinux"), ("native", "aarch64")])
def test_the_arm64_builder(regional_stack, builder, image):
    ImageBuild(regional_stack, "Image", target=ARM, arm64_builder=builder)
    (project,) = Template.from_stack(regional_stack).find_resources("AWS::CodeBuild::Project").values()
    assert image in project["Properties"]["Environment"]["Image"]


def test_build_args_and_the_mirror_reach_the_build_and_key_its_tags(regional_stack):
    args = {"PIP_INDEX_URL": "https://mirrors.aliyun.com/pypi/simple"}
    image = ImageBuild(
        regional_stack,
        "Image",
        target=X86,
        build_args=args,
        debian_mirrors=("http://deb.debian.org/debian/", "http://m/d"),
    )
    plain = ImageBuild(regional_stack, "Plain", target=X86)
    env = _env_of(Template.from_stack(regional_stack), "Image")
    assert env["BUILD_ARGS"] == "PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple"
    assert env["DEBIAN_MIRRORS"] == "http://deb.debian.org/debian http://m/d"  # in order, one word each
    assert _env_of(Template.from_stack(regional_stack), "Plain")["BUILD_ARGS"] == ""
    # another build is another image: the tag (the build's key) changes, so instances pull the new one
    assert image.image_tag != plain.image_tag and image.image_tag.startswith("x86-64-cpu-")


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"arm64_builder": "qemu"}, r"arm64 builder 'qemu': use one of cross, native"),
        ({"debian_mirrors": ("ftp://mirror/debian",)}, r"debianMirrors 'ftp://mirror/debian': write the mirror's"),
        ({"debian_mirrors": ()}, r"debianMirrors is empty"),
        ({"build_args": {"lower": "x"}}, r"a build argument name is upper case letters"),
        ({"build_args": {"NOPE": "x"}}, r"declare no NOPE; use one of"),
        ({"build_args": {"PIP_INDEX_URL": "http://x"}}, r"use an https:// URL"),
        ({"build_args": {"LLAMA_BASE": "x"}}, r"declare no LLAMA_BASE"),  # reserved: the build script sets it
    ],
)
def test_props_are_checked_before_anything_is_built(regional_stack, props, message):
    with pytest.raises(PropsError, match=message):
        ImageBuild(regional_stack, "Image", target=X86, **props)
    assert regional_stack.node.try_find_child("Image") is None


def test_the_cuda_base_compiles_on_xlarge_and_every_other_stage_on_large(regional_stack):
    from gguf_serve.catalog.images import IMAGE_TARGETS

    ImageBuild(regional_stack, "Image", target=IMAGE_TARGETS["cuda"])
    builds = Template.from_stack(regional_stack).find_resources("AWS::CloudFormation::CustomResource")
    compute = {b["Properties"]["Stage"]: b["Properties"]["ComputeType"] for b in builds.values()}
    assert compute == {"roots": "BUILD_GENERAL1_LARGE", "base": "BUILD_GENERAL1_XLARGE", "app": "BUILD_GENERAL1_LARGE"}
