"""Bytes per generated token from a GGUF's tensor table and from the lock, the read probe, and the report's figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gguf_serve.local.bench import bandwidth, results, roofline
from tests.committed import CATALOG, GEMMA3_270M, QWEN36_35B_A3B

BLOCKS, EXPERTS, USED = 3, 8, 2  # the last block is an MTP (nextn) layer


def tiny_moe(path: Path, *, tied: bool) -> dict[str, int]:
    """A MoE GGUF with an MTP block; returns each tensor's bytes as gguf's own reader counts them."""
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen35moe")
    w.add_block_count(BLOCKS)
    w.add_uint32("qwen35moe.nextn_predict_layers", 1)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(16)
    w.add_value_length(16)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 64), dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", rng.standard_normal((32, 64)).astype(np.float16))
    for i in range(BLOCKS):
        w.add_tensor(f"blk.{i}.attn_q.weight", rng.standard_normal((64, 64)).astype(np.float16))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", rng.standard_normal((EXPERTS, 64, 64), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", rng.standard_normal((EXPERTS, 64, 32)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("tied", [False, True])
def test_the_tensor_table_counts_what_a_step_reads(tmp_path: Path, tied: bool) -> None:
    sizes = tiny_moe(tmp_path / "m.gguf", tied=tied)
    mb = roofline.from_gguf(tmp_path / "m.gguf", QWEN36_35B_A3B, mtp=False)
    trunk = [f"blk.{i}." for i in range(BLOCKS - 1)]
    experts = sum(n for name, n in sizes.items() if "_exps" in name and name.startswith(tuple(trunk)))
    attention = sum(n for name, n in sizes.items() if "attn_q" in name and name.startswith(tuple(trunk)))
    head = sizes["token_embd.weight"] if tied else sizes["output.weight"]  # untied: the embedding is a lookup
    assert (mb.shared_bytes, mb.expert_bytes) == (attention + head, experts)
    assert (mb.experts_used, mb.experts_total) == (USED, EXPERTS)
    assert mb.kv_bytes_per_token == (BLOCKS - 1) * 1 * (16 + 16) * 2  # f16 K and V, MTP block left out
    assert mb.weights_per_step(1) == pytest.approx(attention + head + experts * USED / EXPERTS)
    with_mtp = roofline.from_gguf(tmp_path / "m.gguf", QWEN36_35B_A3B, mtp=True)
    assert with_mtp.expert_bytes > mb.expert_bytes and with_mtp.shared_bytes > mb.shared_bytes


def test_a_batch_shares_the_weights_and_reads_the_union_of_its_experts() -> None:
    mb = roofline.from_lock(QWEN36_35B_A3B, CATALOG.locks[QWEN36_35B_A3B.name], mtp=False)
    one, many = mb.weights_per_step(1), mb.weights_per_step(64)
    assert one == pytest.approx(mb.shared_bytes + mb.expert_bytes * 8 / 256)
    assert mb.weights_per_step(2) == pytest.approx(mb.shared_bytes + mb.expert_bytes * (1 - (248 / 256) ** 2))
    assert one < many < mb.shared_bytes + mb.expert_bytes
    assert mb.per_token(depth=0, streams=64) < mb.per_token(depth=0, streams=1)  # per token, the batch is cheaper
    dense = roofline.from_lock(GEMMA3_270M, CATALOG.locks[GEMMA3_270M.name], mtp=False)
    assert dense.weights_per_step(8) == dense.weights_per_step(1) == GEMMA3_270M.size_bytes
    assert dense.per_token(depth=1000) == GEMMA3_270M.size_bytes + 1000 * GEMMA3_270M.kv_bytes_per_token


def test_the_lock_estimate_matches_the_findings_active_weights() -> None:
    """docs/findings: 39.34 tok/s on c8g.4xlarge is ~1.95 GB of active weights per token, ~77 GB/s."""
    mb = roofline.from_lock(QWEN36_35B_A3B, CATALOG.locks[QWEN36_35B_A3B.name], mtp=False)
    experts = QWEN36_35B_A3B.expert_bytes_per_layer
    assert mb.expert_bytes == sum(experts[:40]) and mb.shared_bytes == QWEN36_35B_A3B.size_bytes - sum(experts)
    assert mb.weights_per_step() / 1e9 == pytest.approx(1.95, abs=0.03)
    assert mb.weights_per_step() * 39.34 / 1e9 == pytest.approx(77, abs=1.5)


def test_speculative_passes_come_from_the_servers_counts() -> None:
    assert roofline.passes_per_token([{"predicted_n": 100, "draft_n": 80, "draft_n_accepted": 60}]) == 0.4
    assert roofline.passes_per_token([{"predicted_n": 100}]) == 1.0
    assert roofline.mean_depth([{"prompt_tokens": 30, "completion_tokens": 100}]) == 80.0


def test_the_report_figures_table() -> None:
    text = roofline.figures_table(results.load(catalog=CATALOG), CATALOG)
    rows = [line.split(" | ") for line in text.splitlines()[2:]]
    assert [r[0].strip("| ") for r in rows] == ["c8g.4xlarge", "c8i.4xlarge", "g5.xlarge"]
    for r in rows:
        tok_s, per_token, implied = float(r[2]), float(r[6]), float(r[7].strip(" |"))
        assert implied == pytest.approx(tok_s * per_token, rel=0.002)
    # g5: 78.8% acceptance drafting 2 per pass (the gpu-mtp profile) gives 1 + 2 x 0.788 tokens per pass
    assert float(rows[2][5]) == pytest.approx(1 / (1 + 2 * 0.788), abs=0.001)


def test_the_probe_counts_its_best_pass_and_refuses_a_cache_sized_array() -> None:
    b = bandwidth.measure(mib=64, threads=2, passes=2)
    assert b.gb_s == pytest.approx(max(b.pass_gb_s), abs=0.01) and b.gb_s > 0
    assert (b.threads, b.array_bytes, len(b.pass_gb_s)) == (2, 64 * 2**20, 2)
    with pytest.raises(ValueError, match="at least 64 MiB"):
        bandwidth.measure(mib=8)
