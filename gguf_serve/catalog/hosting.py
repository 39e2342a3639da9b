"""SageMaker hosting: the ml.* type a serving profile's EC2 type runs on as an endpoint, and the endpoint's numbers.

The types themselves are data (profiles/sagemaker.toml, read by the loader). `sagemaker_profile` puts a profile on
its ml type (the memory plan and threads are checked again on that shape); `plan_sagemaker` derives every number
the endpoint needs from the profile: the startup health-check and download timeouts from its load budget, the
storage volume from the model, the scaling target from its slots. Limits come with their sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.hardware import GIB, Architecture, Hardware
from gguf_serve.catalog.profiles import ServingProfile

MIB = 1024 * 1024
# CreateEndpointConfig ProductionVariant: ContainerStartupHealthCheckTimeoutInSeconds and
# ModelDataDownloadTimeoutInSeconds are 60-3600, VolumeSizeInGB 1-512 (SageMaker API Reference, ProductionVariant,
# https://docs.amazonaws.cn/sagemaker/latest/APIReference/API_ProductionVariant.html; cfn-lint 1.58's schema agrees)
TIMEOUT_RANGE_S = (60, 3600)
MAX_VOLUME_GB = 512
# The container hashes the whole model before llama-server starts (gguf_serve/container/sagemaker/model.py): a
# planning rate well under the 1.5 GB/s one core with SHA extensions measured here (docs/findings: hashlib.sha256).
VERIFY_MIB_S = 400.0
# The staging custom resource (stacks/sagemaker/staging.py) runs inside CloudFormation's wait for a custom resource,
# at most 3600 s (gguf_serve.catalog.images.CUSTOM_RESOURCE_MAX_WAIT_S), with its waiter's polling to spare.
STAGING_BUDGET_S = 3300


@dataclass(frozen=True)
class SageMakerHosting:
    """One [hosting."<EC2 type>"] table of profiles/sagemaker.toml (a twin of the EC2 stacks on that type), or one
    [endpoint_type."<ml type>"] table (an ml type only endpoint profiles run on: profiles/sagemaker/); the shape
    fields are the ml type's."""

    ec2_type: str  # the serving profiles' instance type this replaces; "" for an endpoint type
    ml_type: str
    vcpus: int
    physical_cores: int
    memory_gib: float
    cpu: str
    on_demand_cny_per_hour: float
    price_is_estimate: bool = True
    gpu: str | None = None
    gpu_memory_gib: float = 0.0
    host_reserve_gib: float = 3.0  # OS, Docker and SageMaker's own agents on the host (not published: a margin)
    instance_storage: bool = False  # NVMe instance storage holds the model: no VolumeSizeInGB for this type
    inference_ami: str | None = None  # ProductionVariant InferenceAmiVersion (GPU: the driver the CUDA image needs)
    differs: str = ""  # what changes against the EC2 stack, e.g. another CPU generation: the report's figures
    architecture: str = ""  # endpoint types: arm64 | x86_64 (a twin has its EC2 type's)
    gpu_compute_capability: str | None = None
    estimated_tok_s: float | None = None  # endpoint types: single-stream decode, an ESTIMATE (never measured)
    estimate_basis: str = ""  # how estimated_tok_s was reckoned, one line

    def hardware(self, ec2: Hardware) -> Hardware:
        """The EC2 type's record with this ml type's shape and price (no RI: SageMaker has none)."""
        return replace(
            ec2, instance_type=self.ml_type, vcpus=self.vcpus, physical_cores=self.physical_cores,
            memory_gib=self.memory_gib, cpu=self.cpu, gpu=self.gpu, gpu_memory_gib=self.gpu_memory_gib,
            host_reserve_gib=self.host_reserve_gib, ri_1yr_all_upfront_cny=None,
            on_demand_cny_per_hour=self.on_demand_cny_per_hour, price_is_estimate=self.price_is_estimate,
            gpu_compute_capability=self.gpu_compute_capability or ec2.gpu_compute_capability,
        )  # fmt: skip

    def own_hardware(self) -> Hardware:
        """An endpoint type as a Hardware record of its own: no AMI (SageMaker picks the host), no RI."""
        return Hardware(
            instance_type=self.ml_type, architecture=Architecture(self.architecture), vcpus=self.vcpus,
            physical_cores=self.physical_cores, memory_gib=self.memory_gib, cpu=self.cpu, ami_ssm_parameter="",
            ami_root_snapshot_gib=0, on_demand_cny_per_hour=self.on_demand_cny_per_hour, gpu=self.gpu,
            gpu_memory_gib=self.gpu_memory_gib, gpu_compute_capability=self.gpu_compute_capability,
            host_reserve_gib=self.host_reserve_gib, price_is_estimate=self.price_is_estimate,
        )  # fmt: skip


@dataclass(frozen=True)
class HostedTypes:
    """profiles/sagemaker-hosted.toml: the ml types SageMaker hosting offers per region, and where the list is from."""

    source: str
    regions: dict[str, frozenset[str]]

    def hosts(self, region: str, ml_type: str) -> bool | None:
        """True or False where the region's list is pinned; None where it is not (nothing is known)."""
        listed = self.regions.get(region)
        return None if listed is None else ml_type in listed


@dataclass(frozen=True)
class SageMakerPlan:
    ml_type: str
    startup_timeout_s: int  # ContainerStartupHealthCheckTimeoutInSeconds: hash the model, load it
    download_timeout_s: int  # ModelDataDownloadTimeoutInSeconds: S3 to the instance
    volume_gb: int | None  # VolumeSizeInGB; None where the model lands on instance storage
    staging_s: int  # the staging custom resource's worst case: ModelScope download and the S3 write-back
    target_concurrency: float  # ConcurrentRequestsPerModel per instance that target tracking holds
    min_instances: int
    max_instances: int
    inference_ami: str | None


def sagemaker_stack_name(stack_name: str) -> str:
    """GravitonMoeStack -> GravitonMoeSageMakerStack."""
    return stack_name.removesuffix("Stack") + "SageMakerStack"


def endpoint_name(profile: ServingProfile) -> str:
    """The endpoint's fixed name (its log group is created ahead with it): gguf-serve-<profile>."""
    return f"gguf-serve-{profile.name}"


def sagemaker_profile(profile: ServingProfile, hosting: SageMakerHosting) -> ServingProfile:
    """The profile on its ml type: the same model and flags, validated again on that shape (memory, threads)."""
    if profile.hardware.instance_type != hosting.ec2_type:
        raise ProfileError(f"hosting for {hosting.ec2_type} cannot host profile {profile.name!r} on a different type")
    try:
        return replace(profile, stack_name=sagemaker_stack_name(profile.stack_name),
                       hardware=hosting.hardware(profile.hardware))  # fmt: skip
    except ProfileError as e:
        raise ProfileError(f"on SageMaker ({hosting.ml_type}): {e}") from None


def _whole_minutes(seconds: float) -> int:
    return math.ceil(seconds / 60) * 60


def plan_sagemaker(profile: ServingProfile, hosting: SageMakerHosting) -> SageMakerPlan:
    f, boot, size = profile.fleet, profile.fleet.boot, profile.model.size_bytes
    startup = _whole_minutes(size / (VERIFY_MIB_S * MIB) + boot.model_load_s)
    download = _whole_minutes(size / (boot.cache_read_mib_s * MIB))
    staging = _whole_minutes(size / (boot.planning_download_mib_s * MIB) + size / (boot.cache_upload_mib_s * MIB))
    low, high = TIMEOUT_RANGE_S
    for what, value in (("the startup health check", startup), ("the model download", download)):
        if value > high:
            raise ProfileError(
                f"{profile.stack_name}: {what} needs {value} s for {profile.model.name}, more than SageMaker's "
                f"{high} s; pick a smaller model or raise the planning rates (fleet)"
            )
    if staging > STAGING_BUDGET_S:
        raise ProfileError(
            f"{profile.stack_name}: staging {profile.model.name} may take {staging} s, more than a custom resource "
            f"can wait ({STAGING_BUDGET_S} s); raise fleet.planning_download_mib_s if your link is faster"
        )
    volume = None if hosting.instance_storage else math.ceil(size / GIB) + f.volume.image_headroom_gib
    if volume is not None and volume > MAX_VOLUME_GB:
        raise ProfileError(f"{profile.stack_name}: a {volume} GB volume is over SageMaker's {MAX_VOLUME_GB} GB")
    return SageMakerPlan(
        ml_type=hosting.ml_type,
        startup_timeout_s=max(low, startup),
        download_timeout_s=max(low, download),
        volume_gb=volume,
        staging_s=staging,
        target_concurrency=round(profile.server.parallel * f.scaling.target_busy_slot_ratio, 2),
        min_instances=max(1, f.capacity.min_capacity),  # a real-time variant without inference components keeps one
        max_instances=max(1, f.capacity.max_capacity),
        inference_ami=hosting.inference_ami,
    )
