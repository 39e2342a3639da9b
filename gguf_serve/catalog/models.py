"""A GGUF model artifact on ModelScope, as the catalog builds it from profiles/models.toml and its lock."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class ModelArtifact:
    name: str
    repo: str  # ModelScope owner/name
    file: str
    size_bytes: int  # exact when sha256 is set; otherwise a planning estimate
    sha256: str | None  # None: not locked from a listing yet; a stack serving it is refused at synth
    gguf_architecture: str  # general.architecture in the GGUF header
    has_mtp_layers: bool  # <arch>.nextn_predict_layers > 0
    total_params_b: float
    active_params_b: float
    kv_bytes_per_token: int  # f16 K+V over the full-attention layers only (computed: gguf_serve.catalog.model_facts)
    recurrent_state_bytes_per_slot: int = 0  # linear-attention state, fixed per slot (computed)
    revision: str = "master"  # content is pinned by sha256 where known
    commit: str | None = None  # the listing's commit of the file when locked from a listing: what instances fetch
    quantization: str = "Q4_K_M"
    aliases: tuple[str, ...] = ()  # more names clients may ask for it by (the hop answers them; others get 404)
    expert_bytes_per_layer: tuple[
        int, ...
    ] = ()  # MoE expert tensors per block (gguf_serve.catalog.model_facts); () if dense

    @property
    def is_moe(self) -> bool:
        return self.active_params_b < self.total_params_b

    @property
    def local_name(self) -> str:
        return self.file.rsplit("/", 1)[-1]
