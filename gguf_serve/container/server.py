"""llama-server settings as a runtime spec carries them (the flags: gguf_serve.container.flags)."""

from __future__ import annotations

from dataclasses import dataclass

from gguf_serve.container.names import SERVER_PORT

ALL_LAYERS = 999  # -ngl value meaning "every layer on the GPU"
MAX_QUEUE_PER_SLOT = 256


@dataclass(frozen=True)
class Speculative:
    """Self-speculative decoding with the model's own MTP head."""

    spec_type: str = "draft-mtp"
    draft_n_max: int = 2  # the report: acceptance falls below 70% above 2, and it gets slower


@dataclass(frozen=True)
class ServerSettings:
    ctx_per_slot: int = 32768  # tokens; always explicit (0 would mean 262144 for Qwen3.6)
    parallel: int = 1  # slots (-np)
    threads: int | None = None  # None: one per physical core of the instance
    gpu_layers: int = 0  # 0 on CPU, ALL_LAYERS on the GPU
    speculative: Speculative | None = None  # None: MTP off
    cache_ram_mib: int = 4096  # prompt cache in host RAM; the benchmark runs with 0
    host: str = "0.0.0.0"
    port: int = SERVER_PORT
    metrics: bool = True  # /metrics (needs the API key) feeds autoscaling and dashboards
    n_cpu_moe: int = 0  # MoE expert weights of the first N layers kept in host RAM (--n-cpu-moe); ALL_LAYERS: all
    queue_per_slot: int = 4  # requests waiting per slot before the hop (the hop) answers 429

    @property
    def ctx_total(self) -> int:
        return self.ctx_per_slot * self.parallel
