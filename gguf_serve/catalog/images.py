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
    build_args: tuple[tuple[str, str], ...] = ()  # the target's own Docker build arguments (-c imageBuildArgs wins)
    cuda_architectures: tuple[str, ...] = ()  # compute capabilities compiled (CMAKE_CUDA_ARCHITECTURES), e.g. "86"

    @property
    def platform(self) -> str:
        return "linux/arm64" if self.architecture == Architecture.ARM64 else "linux/amd64"


# A CUDA image runs on a GPU whose compute capability is one it was compiled for, or a later one of the same major
# version (CUDA C++ Programming Guide, "Binary Compatibility"); llama.cpp's CMake compiles the PTX of each too, which
# the driver JIT-compiles for a newer GPU (ggml/src/ggml-cuda/CMakeLists.txt). Never for an older one.
def runs_on(target: ImageTarget, compute_capability: str) -> bool:
    """Whether the target's CUDA code runs on a GPU of this compute capability ("7.5"); CPU targets: always."""
    if not target.cuda_architectures:
        return True
    have = tuple(int(p) for p in compute_capability.split("."))
    return any(have >= (int(a[:-1]), int(a[-1])) for a in target.cuda_architectures)


IMAGE_TARGETS: dict[str, ImageTarget] = {
    t.name: t
    for t in (
        ImageTarget("arm64-cpu", Architecture.ARM64, None, "arm64-cpu.Dockerfile"),
        ImageTarget("x86-64-cpu", Architecture.X86_64, None, "x86-64-cpu.Dockerfile"),
        # g5's A10G (Ampere, 8.6; docker/cuda.Dockerfile's default). One architecture keeps the nvcc compile short.
        ImageTarget("cuda", Architecture.X86_64, "cuda", "cuda.Dockerfile", cuda_architectures=("86",)),
        # g4dn's T4 (Turing, 7.5: NVIDIA, "CUDA GPUs - Compute Capability"), for the SageMaker endpoints Ningxia
        # hosts (ml.g4dn): the same Dockerfile, its one architecture set by the build argument.
        ImageTarget(
            "cuda-t4",
            Architecture.X86_64,
            "cuda",
            "cuda.Dockerfile",
            (("CUDA_ARCHITECTURES", "75"),),
            cuda_architectures=("75",),
        ),  # fmt: skip
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

# The Debian mirrors the image roots may come from, in order (deploy option debianMirrors): the build probes each
# one's signed release (docker/pick-mirror.sh) and bootstraps from the first that answers and verifies, so any
# mirror is safe and a mirror that is down, slow to answer or caught mid-sync only costs seconds. All are in
# mainland China, because the distributions' default mirrors are abroad (public provisioning scripts for the AWS
# China regions switch apt to them for that reason); each publishes its Debian mirror at the URL below:
# Alibaba Cloud https://developer.aliyun.com/mirror/debian, Tsinghua TUNA https://mirrors.tuna.tsinghua.edu.cn/help/
# debian/, USTC https://mirrors.ustc.edu.cn/help/debian.html, Huawei Cloud's mirror site https://mirrors.huaweicloud.com
# (its Debian path not verified here: the probe skips it if wrong). Which of them a CodeBuild build in cn-northwest-1
# reaches, and how fast, is open until a China account runs the probe (the build log names the mirror and its rate;
# gguf-serve-preflight --probe-mirrors).
DEFAULT_DEBIAN_MIRRORS = (
    "https://mirrors.aliyun.com/debian",
    "https://mirrors.tuna.tsinghua.edu.cn/debian",
    "https://mirrors.ustc.edu.cn/debian",
    "https://mirrors.huaweicloud.com/debian",
)

# CloudFormation waits at most this long for a custom resource; ServiceTimeout is "an integer from 1 to 3600"
# (AWS::CloudFormation::CustomResource, https://docs.amazonaws.cn/en_us/AWSCloudFormation/latest/TemplateReference/
# aws-resource-cloudformation-customresource.html). Each image layer has its own custom resource, so each
# layer's build must finish inside it, with the waiter's polling interval to spare.
CUSTOM_RESOURCE_MAX_WAIT_S = 3600
BUILD_POLL_INTERVAL_S = 60
# CodeBuild's own limit is far above this (timeoutInMinutes 5-2160, CodeBuild API Reference, CreateProject): the
# custom resource's hour is what binds, so a first deploy runs each stage as its own build under its own resource.
LAYER_BUILD_TIMEOUT_MIN = 50  # CodeBuild timeout per stage; the waiter gives up at 55 min, CloudFormation at 60

# The build's stages, in order, each its own CodeBuild run and custom resource: the Debian roots (from the mirror,
# kept in ECR), the llama.cpp base (from those roots), the application layer (on that base).
BUILD_STAGES = ("roots", "base", "app")
# Compute per stage (CodeBuild API Reference, ComputeType: LARGE "up to 16 GiB memory and 8 vCPUs", XLARGE "up to
# 72 GiB memory and 36 vCPUs"), from the modelled times in docker/README.md ("Each stage against its limit"): every
# stage fits LARGE with at least twice its modelled time to spare, except the CUDA base's compile (about 3,910
# CPU-s of nvcc, capped at one job per 2.5 GB: 6 jobs on LARGE, about 20 min modelled), which gets XLARGE (28
# jobs, about 8 min). The account's concurrency quota for each is a pre-flight check.
DEFAULT_COMPUTE = "BUILD_GENERAL1_LARGE"
CUDA_BASE_COMPUTE = "BUILD_GENERAL1_XLARGE"


def stage_compute(target: ImageTarget, stage: str) -> str:
    """The CodeBuild compute type a target's stage runs on: XLARGE for every CUDA base, LARGE otherwise."""
    return CUDA_BASE_COMPUTE if target.accelerator == "cuda" and stage == "base" else DEFAULT_COMPUTE
