"""Container image targets (one llama.cpp base Dockerfile each under docker/) and the AWS limits the build obeys."""

from __future__ import annotations

from dataclasses import dataclass

from gguf_serve.catalog.hardware import Architecture


@dataclass(frozen=True)
class ImageTarget:
    name: str
    architecture: Architecture
    accelerator: str | None  # "cuda" or None
    dockerfile: str  # the llama.cpp base, relative to docker/; docker/app.Dockerfile goes on top of it

    @property
    def platform(self) -> str:
        return "linux/arm64" if self.architecture == Architecture.ARM64 else "linux/amd64"


IMAGE_TARGETS: dict[str, ImageTarget] = {
    t.name: t
    for t in (
        ImageTarget("arm64-cpu", Architecture.ARM64, None, "arm64-cpu.Dockerfile"),
        ImageTarget("x86-64-cpu", Architecture.X86_64, None, "x86-64-cpu.Dockerfile"),
        ImageTarget("cuda", Architecture.X86_64, "cuda", "cuda.Dockerfile"),
    )
}

# The application layer every target shares (docker/app.Dockerfile).
APP_DOCKERFILE = "app.Dockerfile"

# Where the arm64 image is built. CodeBuild documents its ARM_CONTAINER environment for a list of regions without
# Beijing or Ningxia (CodeBuild API Reference, ProjectEnvironment.type: "ARM_CONTAINER is available only in
# regions US East (N. Virginia), ...", https://docs.aws.amazon.com/codebuild/latest/APIReference/
# API_ProjectEnvironment.html), while the x86 LINUX_CONTAINER is offered in both. "cross" compiles the arm64
# llama-server on the x86 builder with Debian's aarch64 cross compiler and unpacks the arm64 runtime root without
# running it: no emulator, and it exists wherever the x86 builder does. "native" uses ARM_CONTAINER where the
# account's region offers it (run the pre-flight first); the same Dockerfile then compiles natively.
ARM64_BUILDERS = ("cross", "native")
DEFAULT_ARM64_BUILDER = "cross"

# The Debian mirror the image roots are bootstrapped from (deploy option debianMirror). Any mirror is safe: the
# build checks every Release file against the keyring pinned in docker/keyrings/ and every package against it.
# Alibaba Cloud's mirror is inside mainland China (https://developer.aliyun.com/mirror/debian) and is what public
# provisioning scripts for the AWS China regions switch to, because the distributions' default mirrors are
# abroad; whether a CodeBuild build in cn-northwest-1 reaches it is open until a China account runs one.
DEFAULT_DEBIAN_MIRROR = "https://mirrors.aliyun.com/debian"

# CloudFormation waits at most this long for a custom resource; ServiceTimeout is "an integer from 1 to 3600"
# (AWS::CloudFormation::CustomResource, https://docs.amazonaws.cn/en_us/AWSCloudFormation/latest/TemplateReference/
# aws-resource-cloudformation-customresource.html). Each image layer has its own custom resource, so each
# layer's build must finish inside it, with the waiter's polling interval to spare.
CUSTOM_RESOURCE_MAX_WAIT_S = 3600
BUILD_POLL_INTERVAL_S = 60
LAYER_BUILD_TIMEOUT_MIN = 50  # CodeBuild timeout per layer; the waiter gives up at 55 min, CloudFormation at 60
