"""EC2 hardware the field report measured, with its prices (cn-northwest-1, CNY)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

GIB = 1024**3


class Architecture(str, Enum):
    ARM64 = "arm64"
    X86_64 = "x86_64"


@dataclass(frozen=True)
class Hardware:
    instance_type: str
    architecture: Architecture
    vcpus: int
    physical_cores: int  # llama.cpp runs best with one thread per physical core
    memory_gib: float
    cpu: str
    ami_ssm_parameter: str  # public SSM parameter resolved at deploy time, never looked up at synth
    ami_root_snapshot_gib: int  # the AMI's root snapshot: EC2 refuses a smaller root volume at launch
    ri_1yr_all_upfront_cny: float | None = None  # 1-year Standard RI, all upfront (the report's cost basis)
    on_demand_cny_per_hour: float | None = None  # estimate; Ningxia on-demand prices were not in the report
    gpu: str | None = None
    gpu_memory_gib: float = 0.0  # usable device memory as the driver reports it
    host_reserve_gib: float = 2.0  # OS, container runtime, agents
    price_is_estimate: bool = False

    @property
    def has_gpu(self) -> bool:
        return self.gpu is not None

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def gpu_memory_bytes(self) -> int:
        return int(self.gpu_memory_gib * GIB)


_AL2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-{arch}"
# AL2023's root snapshot is 8 GiB (its block-device mapping; public reports agree). Open until DescribeImages in
# the user's account says so: `python -m preflight` checks the snapshot of the AMI each parameter resolves to.
_AL2023_SNAPSHOT_GIB = 8
# Deep Learning Base AMI: ships the NVIDIA driver, Docker and the NVIDIA container toolkit, and several CUDA
# toolkits (DLAMI release notes on docs.amazonaws.cn list four under /usr/local/cuda-*). Its root snapshot is about
# 75 GiB (public configurations resolving this parameter require >= 75 GB; AWS recommends 100 GB); the
# pre-flight reads the exact size.
_DLAMI_GPU = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
_DLAMI_SNAPSHOT_GIB = 75

HARDWARE: dict[str, Hardware] = {
    hw.instance_type: hw
    for hw in (
        Hardware(
            instance_type="c8g.4xlarge",
            architecture=Architecture.ARM64,
            vcpus=16,
            physical_cores=16,  # Graviton4 has no SMT
            memory_gib=32,
            cpu="AWS Graviton4 (Neoverse V2)",
            ami_ssm_parameter=_AL2023.format(arch="arm64"),
            ami_root_snapshot_gib=_AL2023_SNAPSHOT_GIB,
            ri_1yr_all_upfront_cny=9069,
        ),
        Hardware(
            instance_type="c8g.8xlarge",
            architecture=Architecture.ARM64,
            vcpus=32,
            physical_cores=32,
            memory_gib=64,
            cpu="AWS Graviton4 (Neoverse V2)",
            ami_ssm_parameter=_AL2023.format(arch="arm64"),
            ami_root_snapshot_gib=_AL2023_SNAPSHOT_GIB,
            ri_1yr_all_upfront_cny=18138,  # the report's "~¥1,500/month": twice the 4xlarge
            price_is_estimate=True,
        ),
        Hardware(
            instance_type="c8i.4xlarge",
            architecture=Architecture.X86_64,
            vcpus=16,
            physical_cores=8,  # two hyper-threads per core
            memory_gib=32,
            cpu="Intel Xeon (8th gen)",
            ami_ssm_parameter=_AL2023.format(arch="x86_64"),
            ami_root_snapshot_gib=_AL2023_SNAPSHOT_GIB,
            ri_1yr_all_upfront_cny=13237,
        ),
        Hardware(
            instance_type="g5.xlarge",
            architecture=Architecture.X86_64,
            vcpus=4,
            physical_cores=2,
            memory_gib=16,
            cpu="AMD EPYC",
            ami_ssm_parameter=_DLAMI_GPU,
            ami_root_snapshot_gib=_DLAMI_SNAPSHOT_GIB,
            ri_1yr_all_upfront_cny=34228,
            on_demand_cny_per_hour=9.51,  # Beijing, 2024; Ningxia unknown
            gpu="NVIDIA A10G",
            gpu_memory_gib=22.49,  # 24 GB board, 23028 MiB visible to CUDA
        ),
    )
}
