"""The memory-fit planner: where a model's weights, KV cache and prompt cache go, and whether they fit."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gguf_serve.catalog.hardware import GIB, Hardware
from gguf_serve.catalog.models import ModelArtifact
from gguf_serve.container.server import ALL_LAYERS, ServerSettings

GPU_COMPUTE_RESERVE_GIB = 1.5  # CUDA context and compute buffers beside weights and KV cache


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
