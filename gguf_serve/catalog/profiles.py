"""The serving profile type: hardware + model + server settings, validated when built.

The profiles themselves are data (profiles/serving/*.toml), loaded by `loader`; the memory-fit planner is
`memory` and this machine's profile `local`. This module loads nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.fleet import FleetSettings
from gguf_serve.catalog.hardware import GIB, Architecture, Hardware
from gguf_serve.catalog.images import IMAGE_TARGETS, ImageTarget, runs_on
from gguf_serve.catalog.memory import plan_memory
from gguf_serve.catalog.models import ModelArtifact
from gguf_serve.container.server import MAX_QUEUE_PER_SLOT, ServerSettings, Speculative
from gguf_serve.container.spec import RuntimeModel, RuntimeSpec

# PutLifecycleHook HeartbeatTimeout: "from 30 to 7200 seconds" (EC2 Auto Scaling API Reference). The stack's
# creation signal (CreationPolicy ResourceSignal, up to PT12H) and the health-check grace use the same budget.
MAX_HOOK_HEARTBEAT_S = 7200


@dataclass(frozen=True)
class ServingProfile:
    name: str
    stack_name: str
    hardware: Hardware
    model: ModelArtifact
    server: ServerSettings
    image: ImageTarget
    fleet: FleetSettings = field(default_factory=FleetSettings)
    description: str = ""

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def threads(self) -> int:
        return self.server.threads or self.hardware.physical_cores

    @property
    def mtp(self) -> bool:
        return self.server.speculative is not None

    @property
    def root_volume_gib(self) -> int:
        """The AMI's own snapshot, the model, and headroom for image layers and logs."""
        hw = self.hardware
        return hw.ami_root_snapshot_gib + math.ceil(self.model.size_bytes / GIB) + self.fleet.volume.image_headroom_gib

    def boot_plan_s(self) -> dict[str, float]:
        """Seconds per step of the worst first boot: packages, image pull, cold ModelScope download, S3 write-back."""
        f, mib = self.fleet.boot, 1024 * 1024
        return {
            "packages": f.package_install_s,
            "image_pull": f.image_pull_gib * GIB / (f.image_pull_mib_s * mib),
            "model_download": self.model.size_bytes / (f.planning_download_mib_s * mib),
            "cache_write_back": self.model.size_bytes / (f.cache_upload_mib_s * mib),
            "model_load": f.model_load_s,
        }

    @property
    def boot_budget_s(self) -> int:
        """Worst-case seconds from launch to /health 200, rounded up to whole minutes."""
        return math.ceil(sum(self.boot_plan_s().values()) / 60) * 60

    def wake_plan_s(self, *, warm_pool: bool | None = None) -> dict[str, float]:
        """Seconds per step of a wake-up from zero to /health 200: a warm-pool instance starts and reads the model
        from its own volume; without a warm pool (or on Spot, which has none) a new instance boots with the model in
        the stack's S3 cache. `warm_pool`: whether the group has one (None: the profile's own, warm_pool_size > 0;
        a stack's plan passes what its deploy options leave). The instance start is a planning figure, not measured."""
        f, mib = self.fleet.boot, 1024 * 1024
        if warm_pool is None:
            warm_pool = self.fleet.capacity.warm_pool_size > 0
        if warm_pool:
            return {
                "instance_start": f.instance_start_s,
                "model_read": self.model.size_bytes / (self.fleet.volume.volume_throughput_mibps * mib),
                "model_load": f.model_load_s,
            }
        return {
            "instance_start": f.instance_start_s,
            "packages": f.package_install_s,
            "image_pull": f.image_pull_gib * GIB / (f.image_pull_mib_s * mib),
            "cache_read": self.model.size_bytes / (f.cache_read_mib_s * mib),
            "model_load": f.model_load_s,
        }

    def wake_up_s(self, *, warm_pool: bool | None = None) -> int:
        """Expected seconds from a wake-up to /health 200 (the wake door's first Retry-After), whole seconds up."""
        return math.ceil(sum(self.wake_plan_s(warm_pool=warm_pool).values()))

    @property
    def wake_s(self) -> int:
        """wake_up_s with the profile's own warm pool."""
        return self.wake_up_s()

    def vcpu_plan(self) -> dict[str, int]:
        """vCPUs running at once with the profile's own group sizes (Capacity.vcpu_plan)."""
        return self.fleet.capacity.vcpu_plan(self.hardware.vcpus)

    def memory_plan(self) -> dict[str, float]:
        """GiB needed where the weights live (host RAM or GPU memory); `cpu_experts` when n_cpu_moe keeps some
        expert weights in host RAM (then `weights` is the GPU's share)."""
        return plan_memory(self.model, self.server, reserve_gib=None if self.on_gpu else self.hardware.host_reserve_gib)

    @property
    def on_gpu(self) -> bool:
        return self.server.gpu_layers > 0

    def with_server(self, **changes: Any) -> ServingProfile:
        return replace(self, server=replace(self.server, **changes))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def runtime(self) -> RuntimeSpec:
        """What an instance is given: the model, the server flags and the port; no hardware, fleet or prices."""
        m = self.model
        model = RuntimeModel(
            name=m.name,
            repo=m.repo,
            file=m.file,
            revision=m.revision,
            commit=m.commit,
            size_bytes=m.size_bytes,
            sha256=m.sha256,
            gguf_architecture=m.gguf_architecture,
            has_mtp_layers=m.has_mtp_layers,
            aliases=m.aliases,
        )
        return RuntimeSpec(name=self.name, model=model, server=self.server, threads=self.threads)

    def runtime_json(self) -> str:
        """The runtime spec as the instance gets it: editing a price or a description changes none of it."""
        return self.runtime().to_json()

    @classmethod
    def from_json(cls, text: str) -> ServingProfile:
        d = json.loads(text)
        hw = d["hardware"]
        hw["architecture"] = Architecture(hw["architecture"])
        img = d["image"]
        img["architecture"] = Architecture(img["architecture"])
        img["build_args"] = tuple(tuple(pair) for pair in img.get("build_args", ()))
        img["cuda_architectures"] = tuple(img.get("cuda_architectures", ()))
        srv = d["server"]
        if srv["speculative"] is not None:
            srv["speculative"] = Speculative(**srv["speculative"])
        return cls(
            name=d["name"],
            stack_name=d["stack_name"],
            hardware=Hardware(**hw),
            model=ModelArtifact(
                **{
                    **d["model"],
                    "expert_bytes_per_layer": tuple(d["model"]["expert_bytes_per_layer"]),
                    "aliases": tuple(d["model"].get("aliases", ())),
                }  # fmt: skip
            ),
            server=ServerSettings(**srv),
            image=ImageTarget(**img),
            fleet=_fleet_from_json(d["fleet"]),
            description=d.get("description", ""),
        )


def _fleet_from_json(d: dict[str, Any]) -> FleetSettings:
    def part(kind: type, values: dict[str, Any]) -> Any:  # JSON arrays (spot_instance_types): tuples again
        return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    return FleetSettings(**{name: part(kind, d[name]) for name, kind in FleetSettings.parts().items()})


def build_profile(
    *,
    name: str,
    stack_name: str,
    instance_type: str,
    model: str,
    server: ServerSettings,
    image: str,
    fleet: FleetSettings | None = None,
    description: str = "",
    hardware: dict[str, Hardware],
    models: dict[str, ModelArtifact],
) -> ServingProfile:
    """Build a profile from names (looked up in a loaded catalog's hardware and models), failing with what to
    change when a name is unknown."""
    hw = _lookup(hardware, instance_type, "instance type")
    artifact = _lookup(models, model, "model")
    target = _lookup(IMAGE_TARGETS, image, "image target")
    return ServingProfile(
        name=name,
        stack_name=stack_name,
        hardware=hw,
        model=artifact,
        server=server,
        image=target,
        fleet=fleet or FleetSettings(),
        description=description,
    )


def _lookup(table: dict[str, Any], key: str, what: str) -> Any:
    if key not in table:
        raise ProfileError(f"unknown {what} {key!r}: use one of {', '.join(sorted(table))} (profiles/)")
    return table[key]


def _validate(p: ServingProfile) -> None:
    hw, s, m = p.hardware, p.server, p.model
    where = f"profile {p.name!r}"
    if p.image.architecture != hw.architecture:
        raise ProfileError(
            f"{where}: image {p.image.name!r} is {p.image.architecture.value} but {hw.instance_type} is "
            f"{hw.architecture.value}; pick an image target built for {hw.architecture.value}"
        )
    if p.image.accelerator == "cuda" and not hw.has_gpu:
        raise ProfileError(f"{where}: image {p.image.name!r} needs a GPU instance; {hw.instance_type} has none")
    if hw.gpu_compute_capability and not runs_on(p.image, hw.gpu_compute_capability):
        fits = [t.name for t in IMAGE_TARGETS.values() if t.accelerator and runs_on(t, hw.gpu_compute_capability)]
        raise ProfileError(
            f"{where}: image {p.image.name!r} is compiled for CUDA compute capability "
            f"{', '.join(p.image.cuda_architectures)}, and {hw.instance_type}'s {hw.gpu} is "
            f"{hw.gpu_compute_capability}: its kernels cannot run there; use image {' or '.join(fits) or '(none)'}"
        )
    if s.gpu_layers > 0 and not hw.has_gpu:
        raise ProfileError(f"{where}: gpu_layers={s.gpu_layers} on {hw.instance_type}, which has no GPU; set 0")
    if s.speculative is not None:
        if not m.has_mtp_layers:
            raise ProfileError(
                f"{where}: MTP is on but {m.file} has no MTP layers ({m.gguf_architecture}.nextn_predict_layers "
                "is 0); use an MTP GGUF (an *-MTP-GGUF repo) or set speculative=None (remove [server.speculative])"
            )
        if s.parallel != 1:
            raise ProfileError(f"{where}: MTP with parallel={s.parallel} loses draft acceptance; use parallel=1")
        if not 1 <= s.speculative.draft_n_max <= 8:
            raise ProfileError(f"{where}: draft_n_max must be 1-8 (the report found 2 best)")
    if s.n_cpu_moe < 0:
        raise ProfileError(f"{where}: n_cpu_moe must be 0 (all on the GPU), a block count, or 'all'")
    if s.n_cpu_moe and not p.on_gpu:
        raise ProfileError(f"{where}: n_cpu_moe={s.n_cpu_moe} without GPU layers: every weight is on the CPU already")
    if s.n_cpu_moe and not m.expert_bytes_per_layer:
        raise ProfileError(f"{where}: n_cpu_moe={s.n_cpu_moe} but {m.name} is dense (no expert tensors); set 0")
    if s.ctx_per_slot < 512 or s.parallel < 1:
        raise ProfileError(f"{where}: ctx_per_slot must be at least 512 and parallel at least 1")
    if not 0 <= s.queue_per_slot <= MAX_QUEUE_PER_SLOT:
        raise ProfileError(
            f"{where}: queue_per_slot={s.queue_per_slot}: requests waiting per slot before 429 must be "
            f"0-{MAX_QUEUE_PER_SLOT} (default 4)"
        )
    if s.threads is not None and not 1 <= s.threads <= hw.vcpus:
        raise ProfileError(f"{where}: threads={s.threads} but {hw.instance_type} has {hw.vcpus} vCPUs")
    if p.boot_budget_s > MAX_HOOK_HEARTBEAT_S:
        raise ProfileError(
            f"{where}: a cold boot may take {p.boot_budget_s} s ({_plan_text(p.boot_plan_s())}), more than a launch "
            f"lifecycle hook can wait ({MAX_HOOK_HEARTBEAT_S} s); pick a smaller model or raise the planning bandwidths"
        )
    capacity = p.fleet.capacity
    if capacity.min_capacity > capacity.max_capacity:
        raise ProfileError(f"{where}: min_capacity {capacity.min_capacity} > max_capacity {capacity.max_capacity}")
    _check_memory(p)


def _plan_text(plan: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in plan.items())


def memory_fit(p: ServingProfile) -> tuple[float, float, str]:
    """GiB needed where the weights live, GiB there, and what that memory is (RAM or the GPU's)."""
    plan = p.memory_plan()
    if p.on_gpu:
        need = plan["weights"] + plan["kv_cache"] + plan["recurrent_state"] + plan["reserve"]
        return need, p.hardware.gpu_memory_gib, f"{p.hardware.gpu} memory"
    return sum(plan.values()), p.hardware.memory_gib, "RAM"


def deploy_refusal(p: ServingProfile) -> str | None:
    """Why a valid profile's stack must not deploy yet (the trust root is the pinned sha256), or None."""
    if p.model.sha256:
        return None
    return (
        f"{p.stack_name or p.name}: model {p.model.name} ({p.model.repo}/{p.model.file}) has no pinned sha256, so an "
        f"instance could not tell its bytes from any others; `cdk synth` locks it where ModelScope is reachable, or "
        f"run `gguf-serve-catalog lock {p.model.name}` with access to ModelScope; commit profiles/models.lock.toml"
    )


def _check_memory(p: ServingProfile) -> None:
    plan = p.memory_plan()
    device_need, capacity, where = memory_fit(p)
    if p.on_gpu and "cpu_experts" in plan:
        host_need = plan["cpu_experts"] + plan["prompt_cache"] + p.hardware.host_reserve_gib
        if host_need > p.hardware.memory_gib:
            raise ProfileError(
                f"profile {p.name!r}: n_cpu_moe={p.server.n_cpu_moe} keeps {plan['cpu_experts']:.1f} GiB of expert "
                f"weights in host RAM; with the prompt cache {plan['prompt_cache']:.1f} and reserve "
                f"{p.hardware.host_reserve_gib:.1f} that is {host_need:.1f} GiB, more than {p.hardware.memory_gib:.1f} "
                "GiB of host RAM; lower cache_ram_mib or n_cpu_moe, or add RAM"
            )
    elif p.on_gpu:
        host_need = plan["prompt_cache"] + p.hardware.host_reserve_gib
        if host_need > p.hardware.memory_gib:
            raise ProfileError(
                f"profile {p.name!r}: prompt cache {plan['prompt_cache']:.1f} GiB does not fit "
                f"{p.hardware.memory_gib} GiB of host RAM; lower cache_ram_mib"
            )
    if device_need > capacity:
        parts = ", ".join(
            f"{k} {v:.1f}" for k, v in plan.items() if k not in ("cpu_experts", "prompt_cache") or not p.on_gpu
        )
        raise ProfileError(
            f"profile {p.name!r}: {p.model.name} needs {device_need:.1f} GiB ({parts}) but "
            f"{p.hardware.instance_type} has {capacity:.1f} GiB of {where}; pick a larger instance, a smaller "
            "model or quantization, or lower ctx_per_slot / parallel / cache_ram_mib"
        )
