"""An EC2 instance type as the catalog sees it. The instance types themselves are data: profiles/hardware.toml."""

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
    gpu_compute_capability: str | None = None  # e.g. "8.6": which CUDA images run on it (images.runs_on)
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
