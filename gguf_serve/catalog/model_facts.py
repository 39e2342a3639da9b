"""What a model needs in memory, computed from its GGUF header facts as llama.cpp (b11312) allocates it.

The facts are the header's own keys without the `<arch>.` prefix (`block_count`, `attention.head_count_kv`,
`ssm.state_size`, ...) plus `architecture` (general.architecture). The lock step reads them from the file
(gguf_serve.catalog.lock) and writes them to the lock file; nothing here is typed by hand.
"""

from __future__ import annotations

import re
from typing import Any

from gguf_serve.catalog.errors import ProfileError

KV_CACHE_BYTES = 2  # f16 K and V: llama-server's default --cache-type-k/-v
RECURRENT_BYTES = 4  # llama_memory_recurrent keeps conv and SSM state in f32
DEFAULT_FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default for qwen35/qwen35moe when the key is absent
# The tensors `--n-cpu-moe N` keeps in host RAM for each of the first N blocks: llama.cpp's LLM_FFN_EXPS_REGEX
# ("\\.ffn_(up|down|gate|gate_up)_(ch|)exps", common/common.h, b11312) behind `blk\\.<i>`, searched in the name.
EXPERT_TENSOR = re.compile(r"blk\.(\d+)\.ffn_(up|down|gate|gate_up)_(ch|)exps")
EXPERT_MATRICES = 3  # gate, up and down projections per expert
# llama.cpp refuses a model past these (src/llama-hparams.h LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS, asserted in
# src/llama-model.cpp, pinned build): a header that claims more is not a model llama-server loads, and planning
# per layer from it would allocate without bound (a block_count of 10^9 took gigabytes).
MAX_LAYERS, MAX_EXPERTS = 512, 1024
CEILINGS = {"block_count": MAX_LAYERS, "expert_count": MAX_EXPERTS}

# The header keys the lock records: enough for the memory plan, the MTP check and a reader's picture of the model.
HEADER_KEYS = (
    "context_length",
    "embedding_length",
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "nextn_predict_layers",
    "full_attention_interval",
    "ssm.conv_kernel",
    "ssm.state_size",
    "ssm.group_count",
    "ssm.inner_size",
    "ssm.time_step_rank",
)


def header_facts(meta: dict[str, Any]) -> dict[str, Any]:
    """The facts the catalog keeps from a header read by the fetcher's `gguf` module (the rest dropped)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ProfileError("the GGUF header has no general.architecture: not a model file")
    facts: dict[str, Any] = {"architecture": arch}
    for key in HEADER_KEYS:
        value = meta.get(f"{arch}.{key}")
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, list) and all(isinstance(v, int) for v in value)):
            facts[key] = value
    check_ceilings(facts, "the GGUF header")
    return facts


def check_ceilings(facts: dict[str, Any], where: str) -> None:
    """Layer and expert counts llama.cpp can load; nextn (MTP) layers are among the blocks, used experts among all."""
    for key, most in CEILINGS.items():
        value = facts.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:  # a bad low value: the loader
            raise ProfileError(f"{where}: {key} = {value:,} is more than llama.cpp loads ({most}); not a model file")
    pairs = (("nextn_predict_layers", "block_count"), ("expert_used_count", "expert_count"))
    for part, whole in pairs:
        a, b = facts.get(part), facts.get(whole)
        if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and a > b:
            raise ProfileError(f"{where}: {part} = {a:,} is more than {whole} = {b:,}; not a model file")


def _int(facts: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = facts.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProfileError(f"{where}: header fact {key!r} is missing or not a non-negative integer ({value!r})")
    return value


def _per_layer(facts: dict[str, Any], key: str, n_layers: int, where: str) -> list[int]:
    value = facts.get(key)
    if isinstance(value, list):
        if len(value) < n_layers:
            raise ProfileError(f"{where}: {key!r} lists {len(value)} layers, the model has {n_layers}")
        return value[:n_layers]
    return [_int(facts, key, where)] * n_layers


def trunk_layers(facts: dict[str, Any], where: str = "model") -> int:
    """Layers of the main model: block_count less the MTP (nextn) layers, which only the draft context runs."""
    return _int(facts, "block_count", where) - mtp_layers(facts)


def mtp_layers(facts: dict[str, Any]) -> int:
    value = facts.get("nextn_predict_layers", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def recurrent_layers(facts: dict[str, Any], where: str = "model") -> list[int]:
    """Linear-attention (gated delta net / SSM) layers: every layer but each `full_attention_interval`-th one."""
    if "ssm.state_size" not in facts:
        return []
    interval = _int(facts, "full_attention_interval", where, DEFAULT_FULL_ATTENTION_INTERVAL) or 1
    return [i for i in range(trunk_layers(facts, where)) if (i + 1) % interval != 0]


def kv_bytes_per_token(facts: dict[str, Any], where: str = "model") -> int:
    """f16 K+V bytes per token of context over the layers that keep a KV cache (llama.cpp's attention filter).

    Sliding-window layers are counted at full context: an upper bound, as the catalog plans for the worst case.
    """
    n = trunk_layers(facts, where)
    heads = _int(facts, "attention.head_count", where, 0)
    default_head = _int(facts, "embedding_length", where, 0) // heads if heads else None
    k = _int(facts, "attention.key_length", where, default_head)
    v = _int(facts, "attention.value_length", where, default_head)
    kv_heads = _per_layer(facts, "attention.head_count_kv", n, where)
    recurrent = set(recurrent_layers(facts, where))
    return sum(kv_heads[i] * (k + v) * KV_CACHE_BYTES for i in range(n) if i not in recurrent)


def recurrent_state_bytes(facts: dict[str, Any], where: str = "model") -> int:
    """Fixed bytes per slot of the recurrent layers: conv state (d_conv - 1) x (d_inner + 2 n_group d_state) plus
    SSM state d_state x d_inner, in f32 (llama_hparams::n_embd_r and n_embd_s)."""
    layers = recurrent_layers(facts, where)
    if not layers:
        return 0
    conv = _int(facts, "ssm.conv_kernel", where)
    state = _int(facts, "ssm.state_size", where)
    inner = _int(facts, "ssm.inner_size", where)
    groups = _int(facts, "ssm.group_count", where)
    per_layer = max(conv - 1, 0) * (inner + 2 * groups * state) + state * inner
    return len(layers) * per_layer * RECURRENT_BYTES


def expert_bytes_from_tensors(tensors: list[tuple[str, int]], n_blocks: int) -> list[int]:
    """Bytes of the expert tensors per block, from (name, bytes) of the file's tensor info table; [] if dense."""
    per_block = [0] * n_blocks
    for name, size in tensors:
        m = EXPERT_TENSOR.search(name)
        if m and int(m.group(1)) < n_blocks:
            per_block[int(m.group(1))] += size
    return per_block if any(per_block) else []


def estimated_expert_bytes(facts: dict[str, Any], size_bytes: int, total_params_b: float, where: str) -> list[int]:
    """Expert bytes per block from header facts alone, for a lock without the tensor table (a typed entry).

    Each block holds expert_count experts of EXPERT_MATRICES matrices of embedding_length x
    expert_feed_forward_length weights; every block carries them, the MTP (nextn) block too. Bytes per weight is
    the file's average, size_bytes / (total_params_b x 1e9): a mixed quantization (UD-Q4_K_M) gives the experts
    about the file's mean bits, the larger attention and embedding types pull the mean slightly up, so this
    errs towards more bytes on the CPU. `gguf-serve-catalog lock` replaces it with the tensors' own sizes.
    """
    experts = facts.get("expert_count", 0)
    if not experts or total_params_b <= 0:
        return []
    ff = _int(facts, "expert_feed_forward_length", where)
    params = EXPERT_MATRICES * _int(facts, "expert_count", where) * _int(facts, "embedding_length", where) * ff
    per_block = round(params * size_bytes / (total_params_b * 1e9))
    return [per_block] * _int(facts, "block_count", where)
