"""Serving profiles: hardware + model + server settings, validated when built.

The profiles themselves are data (profiles/serving/*.toml, loaded by catalog.loader on first use of PROFILES).
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from catalog.errors import ProfileError
from catalog.fleet import FleetSettings
from catalog.hardware import GIB, Architecture, Hardware
from catalog.images import IMAGE_TARGETS, ImageTarget
from catalog.models import ModelArtifact
from catalog.runtime import RuntimeModel, RuntimeSpec
from catalog.server import ALL_LAYERS, MAX_QUEUE_PER_SLOT, ServerSettings, Speculative

GPU_COMPUTE_RESERVE_GIB = 1.5  # CUDA context and compute buffers beside weights and KV cache
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
        return hw.ami_root_snapshot_gib + math.ceil(self.model.size_bytes / GIB) + self.fleet.image_headroom_gib

    def boot_plan_s(self) -> dict[str, float]:
        """Seconds per step of the worst first boot: packages, image pull, cold ModelScope download, S3 write-back."""
        f, mib = self.fleet, 1024 * 1024
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

    def vcpu_plan(self) -> dict[str, int]:
        """vCPUs running at once, against the account's On-Demand (or Spot) vCPU quota.

        create: the first instance and the warm pool's instances boot together (warm-pool instances run their
        user data, then stop); update: a rolling update adds `rolling_batch` instances beside those;
        scale_out: every instance up to max_capacity, the warm pool refilling.
        """
        f, v = self.fleet, self.hardware.vcpus
        return {
            "create": (f.min_capacity + f.warm_pool_size) * v,
            "update": (f.min_capacity + f.warm_pool_size + f.rolling_batch) * v,
            "scale_out": (f.max_capacity + f.warm_pool_size) * v,
        }

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
            size_bytes=m.size_bytes,
            sha256=m.sha256,
            gguf_architecture=m.gguf_architecture,
            has_mtp_layers=m.has_mtp_layers,
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
        srv = d["server"]
        if srv["speculative"] is not None:
            srv["speculative"] = Speculative(**srv["speculative"])
        return cls(
            name=d["name"],
            stack_name=d["stack_name"],
            hardware=Hardware(**hw),
            model=ModelArtifact(
                **{**d["model"], "expert_bytes_per_layer": tuple(d["model"]["expert_bytes_per_layer"])}
            ),
            server=ServerSettings(**srv),
            image=ImageTarget(**img),
            fleet=_fleet_from_json(d["fleet"]),
            description=d.get("description", ""),
        )


def _fleet_from_json(d: dict[str, Any]) -> FleetSettings:
    off = d.get("off_hours")
    return FleetSettings(**{**d, "allowed_cidrs": tuple(d["allowed_cidrs"]), "off_hours": tuple(off) if off else None})


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
) -> ServingProfile:
    """Build a profile from names, failing with what to change when a name is unknown."""
    from catalog.loader import default_catalog

    hw = _lookup(default_catalog().hardware, instance_type, "instance type")
    artifact = _lookup(default_catalog().models, model, "model")
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
        raise ProfileError(f"{where}: image 'cuda' needs a GPU instance; {hw.instance_type} has none")
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
    if p.fleet.spot and hw.has_gpu:
        raise ProfileError(f"{where}: spot is for the CPU stacks; g5 Spot capacity in China is scarce, set spot=False")
    if p.fleet.spot and p.fleet.warm_pool_size:
        # PutWarmPool "cannot be called on an Auto Scaling group that has a mixed instances policy or a launch
        # template or launch configuration that requests Spot Instances" (EC2 Auto Scaling API Reference).
        raise ProfileError(f"{where}: a warm pool cannot hold Spot instances; set warm_pool_size=0 (warmPool=0)")
    if p.boot_budget_s > MAX_HOOK_HEARTBEAT_S:
        raise ProfileError(
            f"{where}: a cold boot may take {p.boot_budget_s} s ({_plan_text(p.boot_plan_s())}), more than a launch "
            f"lifecycle hook can wait ({MAX_HOOK_HEARTBEAT_S} s); pick a smaller model or raise the planning bandwidths"
        )
    if p.fleet.off_hours is not None and not all(0 <= h <= 23 for h in p.fleet.off_hours):
        raise ProfileError(f"{where}: off_hours must be two hours 0-23 (stop, start), e.g. (20, 8)")
    if p.fleet.min_capacity > p.fleet.max_capacity:
        raise ProfileError(f"{where}: min_capacity {p.fleet.min_capacity} > max_capacity {p.fleet.max_capacity}")
    _check_memory(p)


def _plan_text(plan: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in plan.items())


def cpu_expert_bytes(model: ModelArtifact, n_cpu_moe: int) -> int:
    """Bytes of expert weights `--n-cpu-moe n_cpu_moe` keeps in host RAM (ALL_LAYERS: `--cpu-moe`, every block)."""
    return sum(model.expert_bytes_per_layer[: max(n_cpu_moe, 0)])


def plan_memory(model: ModelArtifact, server: ServerSettings, *, reserve_gib: float | None) -> dict[str, float]:
    """A profile's memory plan in GiB; reserve_gib None: on the GPU (its compute reserve)."""
    on_gpu = reserve_gib is None
    cpu_experts = cpu_expert_bytes(model, server.n_cpu_moe) if on_gpu else 0
    plan = {
        "weights": (model.size_bytes - cpu_experts) / GIB,
        "kv_cache": model.kv_bytes_per_token * server.ctx_total / GIB,
        "recurrent_state": model.recurrent_state_bytes_per_slot * server.parallel / GIB,
        "prompt_cache": server.cache_ram_mib / 1024,
        "reserve": GPU_COMPUTE_RESERVE_GIB if reserve_gib is None else reserve_gib,
    }
    if cpu_experts:
        plan["cpu_experts"] = cpu_experts / GIB
    return plan


@dataclass(frozen=True)
class CardFit:
    """How a model and server settings sit on one GPU machine (a workstation card, or a GPU instance)."""

    n_cpu_moe: int  # 0: every weight on the GPU; ALL_LAYERS: --cpu-moe
    gpu_need_gib: float  # weights on the GPU, KV cache, recurrent state, compute reserve
    host_need_gib: float  # experts kept in host RAM, prompt cache, host reserve
    gpu_gib: float
    host_gib: float

    @property
    def fits(self) -> bool:
        return self.gpu_need_gib <= self.gpu_gib and self.host_need_gib <= self.host_gib

    @property
    def flag(self) -> str:
        if self.n_cpu_moe >= ALL_LAYERS:
            return "--cpu-moe"
        return f"--n-cpu-moe {self.n_cpu_moe}" if self.n_cpu_moe else "every layer on the GPU"


def fit_on(model: ModelArtifact, server: ServerSettings, hw: Hardware, n_cpu_moe: int | None = None) -> CardFit:
    """The fit with server.n_cpu_moe (or n_cpu_moe); host RAM holds the CPU-side experts and the prompt cache."""
    if n_cpu_moe is not None:
        server = replace(server, n_cpu_moe=n_cpu_moe)
    plan = plan_memory(model, server, reserve_gib=None)
    gpu = plan["weights"] + plan["kv_cache"] + plan["recurrent_state"] + plan["reserve"]
    host = plan.get("cpu_experts", 0.0) + plan["prompt_cache"] + hw.host_reserve_gib
    return CardFit(server.n_cpu_moe, gpu, host, hw.gpu_memory_gib, hw.memory_gib)


def smallest_fit(model: ModelArtifact, server: ServerSettings, hw: Hardware) -> CardFit:
    """The fit with the fewest blocks' experts on the CPU (0 first, then 1, 2, ... then all). When none fits:
    the first that fits the GPU (host RAM is what is short), else all experts on the CPU. Fewer experts on the
    CPU is faster: each CPU block's experts are read from host memory for every token."""
    blocks = len(model.expert_bytes_per_layer)
    tried = [fit_on(model, server, hw, 0)]
    for n in range(1, blocks + 1):
        if tried[-1].fits:
            return tried[-1]
        tried.append(fit_on(model, server, hw, ALL_LAYERS if n == blocks else n))
    return next((f for f in tried if f.gpu_need_gib <= f.gpu_gib), tried[-1])


def suggest_card(model: ModelArtifact, server: ServerSettings, cards: dict[str, Hardware], *, but: str = "") -> str:
    """Which card size would fit: the smallest that holds the whole model, and a smaller one with n_cpu_moe."""
    ranked = sorted((hw for name, hw in cards.items() if name != but), key=lambda hw: hw.gpu_memory_gib)
    whole = next((hw for hw in ranked if fit_on(model, server, hw, 0).fits), None)
    parts = []
    if whole is not None:
        parts.append(f"a {round(whole.gpu_memory_gib)} GB card fits it ({whole.instance_type})")
    for hw in ranked:
        fit = smallest_fit(model, server, hw)
        if fit.n_cpu_moe and fit.fits and (whole is None or hw.gpu_memory_gib < whole.gpu_memory_gib):
            parts.append(
                f"{round(hw.gpu_memory_gib)} GB with {fit.flag} ({hw.instance_type}, "
                f"{fit.host_need_gib:.1f} of {hw.memory_gib:.0f} GiB RAM)"
            )
            break
    if not parts:
        return "no card in profiles/hardware.toml fits it: lower ctx_per_slot or cache_ram_mib, or pick a smaller model"
    return ", or ".join(parts)


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
        f"run `python -m catalog lock {p.model.name}` with access to ModelScope; commit profiles/models.lock.toml"
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


def __getattr__(name: str) -> Any:
    """PROFILES: every profile of profiles/serving/*.toml, validated, loaded on first use."""
    if name == "PROFILES":
        return _profiles()
    raise AttributeError(f"module 'catalog.profiles' has no attribute {name!r}")


def _profiles() -> dict[str, ServingProfile]:
    from catalog.loader import default_catalog

    return default_catalog().profiles


def profile_by_stack(stack_name: str) -> ServingProfile:
    from catalog.loader import default_catalog

    return default_catalog().profile_by_stack(stack_name)


def local_profile(
    base: str = "graviton-moe", *, model: ModelArtifact | None = None, port: int = 8080
) -> ServingProfile:
    """The base profile's server settings scaled to this machine, serving a small model (the embedded default)."""
    cores = os.cpu_count() or 1
    arch = Architecture.ARM64 if platform.machine() in ("aarch64", "arm64") else Architecture.X86_64
    hw = Hardware(
        instance_type="local",
        architecture=arch,
        vcpus=cores,
        physical_cores=cores,
        memory_gib=_host_memory_gib(),
        cpu=platform.processor() or platform.machine(),
        ami_ssm_parameter="",
        ami_root_snapshot_gib=0,
        host_reserve_gib=1.0,
    )
    from catalog.models import GEMMA3_270M

    model = model or GEMMA3_270M  # the embedded default
    src = _profiles()[base]
    server = replace(src.server, ctx_per_slot=4096, threads=None, cache_ram_mib=256, host="127.0.0.1", port=port)
    image = next(t for t in IMAGE_TARGETS.values() if t.architecture == arch and t.accelerator is None)
    return ServingProfile(
        name=f"local-{base}",
        stack_name="",
        hardware=hw,
        model=model,
        server=server,
        image=image,
        fleet=FleetSettings(min_capacity=1, max_capacity=1),
        description=f"{src.name} settings on this machine with {model.name}",
    )


def _host_memory_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        return kib / 1024 / 1024
    except (OSError, StopIteration, ValueError):
        return 8.0
