"""A tiny random GGUF of the Qwen3.6 dense architecture (`qwen35`) with one MTP (nextn) layer, written with the
pinned `gguf` package, to run llama-server's `draft-mtp` path on CPU. Random weights: it proves the path, not
the quality (draft acceptance is whatever a random model gives).

    python -m tests.rehearsal.tiny_mtp OUT.gguf [--agree]   # about 1 MB; the recipe ships, not the file

--agree makes a degenerate model whose trunk and MTP head always predict "a" (the blocks' outputs are zero, so
the hidden state is the embedding's constant first dimension): every draft is accepted, which shows acceptance
being counted. With random heads (the default) drafts are made and almost none are accepted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ARCH = "qwen35"
N_EMBD, N_FF, N_TRUNK, N_MTP = 64, 128, 4, 1  # layers 0-2 gated delta net, layer 3 attention, layer 4 MTP
N_HEAD, N_HEAD_KV, HEAD_DIM = 2, 1, 32
SSM_CONV, SSM_STATE, SSM_GROUPS, SSM_V_HEADS = 4, 16, 2, 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 single-byte tokens of a byte-level BPE vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write(path: Path, *, seed: int = 0, agree: bool = False) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    tokens = _byte_tokens() + SPECIAL
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name("qwen36-tiny-mtp-random")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_TRUNK + N_MTP)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM // 2)
    w.add_rope_dimension_sections([3, 3, 2, 0])
    w.add_rope_freq_base(1e7)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(SSM_CONV)
    w.add_ssm_state_size(SSM_STATE)
    w.add_ssm_group_count(SSM_GROUPS)
    w.add_ssm_time_step_rank(SSM_V_HEADS)
    w.add_ssm_inner_size(SSM_STATE * SSM_V_HEADS)
    w.add_full_attention_interval(4)
    w.add_nextn_predict_layers(N_MTP)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * len(SPECIAL))
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(256 + SPECIAL.index("<|im_end|>"))
    w.add_bos_token_id(256)
    w.add_pad_token_id(256)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, *shape: int, norm: bool = False, out: bool = False) -> np.ndarray:
        """shape innermost first, as gguf lists it (numpy's is the reverse); out: a block's output projection."""
        data = np.ones(shape[::-1], np.float32) if norm else rng.normal(0, 0.05, shape[::-1]).astype(np.float32)
        if agree and out:
            data[:] = 0
        if agree and name.endswith(("output_norm.weight", "shared_head_norm.weight")):
            data[1:] = 0  # only the first dimension reaches the logits
        if agree and name == "token_embd.weight":
            data[:] = 0
            data[:, 0] = 1
        if agree and name == "output.weight":
            data[tokens.index("a"), 0] = 5
        if agree and name.endswith("nextn.eh_proj.weight"):
            data[0, 0] = data[0, N_EMBD] = 1
        w.add_tensor(name, data)
        return data

    q_dim, kv_dim = HEAD_DIM * N_HEAD, HEAD_DIM * N_HEAD_KV
    key_dim, value_dim = SSM_STATE * SSM_GROUPS, SSM_STATE * SSM_V_HEADS
    tensor("token_embd.weight", N_EMBD, n_vocab)
    tensor("output_norm.weight", N_EMBD, norm=True)
    tensor("output.weight", N_EMBD, n_vocab)

    def attention(il: int) -> None:
        tensor(f"blk.{il}.attn_q.weight", N_EMBD, q_dim * 2)  # query and its gate
        tensor(f"blk.{il}.attn_k.weight", N_EMBD, kv_dim)
        tensor(f"blk.{il}.attn_v.weight", N_EMBD, kv_dim)
        tensor(f"blk.{il}.attn_output.weight", q_dim, N_EMBD, out=True)
        tensor(f"blk.{il}.attn_q_norm.weight", HEAD_DIM, norm=True)
        tensor(f"blk.{il}.attn_k_norm.weight", HEAD_DIM, norm=True)

    def common(il: int) -> None:
        tensor(f"blk.{il}.attn_norm.weight", N_EMBD, norm=True)
        tensor(f"blk.{il}.post_attention_norm.weight", N_EMBD, norm=True)
        tensor(f"blk.{il}.ffn_gate.weight", N_EMBD, N_FF)
        tensor(f"blk.{il}.ffn_down.weight", N_FF, N_EMBD, out=True)
        tensor(f"blk.{il}.ffn_up.weight", N_EMBD, N_FF)

    for il in range(N_TRUNK):
        common(il)
        if (il + 1) % 4 == 0:
            attention(il)
        else:
            tensor(f"blk.{il}.attn_qkv.weight", N_EMBD, key_dim * 2 + value_dim)
            tensor(f"blk.{il}.attn_gate.weight", N_EMBD, value_dim)
            tensor(f"blk.{il}.ssm_conv1d.weight", SSM_CONV, key_dim * 2 + value_dim)
            tensor(f"blk.{il}.ssm_dt.bias", SSM_V_HEADS)
            tensor(f"blk.{il}.ssm_a", SSM_V_HEADS)
            tensor(f"blk.{il}.ssm_beta.weight", N_EMBD, SSM_V_HEADS)
            tensor(f"blk.{il}.ssm_alpha.weight", N_EMBD, SSM_V_HEADS)
            tensor(f"blk.{il}.ssm_norm.weight", SSM_STATE, norm=True)
            tensor(f"blk.{il}.ssm_out.weight", value_dim, N_EMBD, out=True)
    for il in range(N_TRUNK, N_TRUNK + N_MTP):
        common(il)
        attention(il)
        tensor(f"blk.{il}.nextn.eh_proj.weight", 2 * N_EMBD, N_EMBD)
        tensor(f"blk.{il}.nextn.enorm.weight", N_EMBD, norm=True)
        tensor(f"blk.{il}.nextn.hnorm.weight", N_EMBD, norm=True)
        tensor(f"blk.{il}.nextn.shared_head_norm.weight", N_EMBD, norm=True)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def artifact(path: Path, repo: str = "local/qwen36-tiny-mtp"):  # noqa: ANN201 - a catalog.ModelArtifact
    """The catalog entry for a file written by write(): pinned by its sha256, MTP layers present."""
    import hashlib

    from gguf_serve.catalog.models import ModelArtifact

    return ModelArtifact(
        name="qwen36-tiny-mtp",
        repo=repo,
        file=path.name,
        size_bytes=path.stat().st_size,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        gguf_architecture=ARCH,
        has_mtp_layers=True,
        total_params_b=0.0003,
        active_params_b=0.0003,
        kv_bytes_per_token=2 * 2 * N_HEAD_KV * HEAD_DIM * 4,  # K+V, the two full-attention layers, f32
    )


def with_gpu_speculation(profile):  # noqa: ANN001, ANN201 - catalog.ServingProfile
    """profile with the GPU profile's speculative settings and slot count (draft-mtp, 2 drafts, one slot)."""
    from dataclasses import replace

    from gguf_serve.catalog import load_catalog

    gpu = load_catalog().profiles["gpu-mtp"].server
    server = replace(profile.server, speculative=gpu.speculative, parallel=gpu.parallel)
    return replace(profile, name=f"{profile.name}-mtp", server=server)


if __name__ == "__main__":
    print(write(Path(sys.argv[1]), agree="--agree" in sys.argv))
