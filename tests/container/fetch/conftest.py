"""Fixtures for the model-delivery tests: a local ModelScope, small files, tiny GGUFs, fast retries."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gguf_serve.container.digest import sha256_file
from gguf_serve.container.fetch.retry import RetryPolicy
from gguf_serve.local.hub import LocalScope
from tests.committed import GEMMA3_270M


@pytest.fixture
def gemma_hub(hub: LocalScope, gemma_gguf: Path) -> LocalScope:
    """The hub serving the real Gemma GGUF under the catalog's repo and file name."""
    hub.add_file(GEMMA3_270M.repo, GEMMA3_270M.file, gemma_gguf)
    return hub


@pytest.fixture
def fast_retry() -> RetryPolicy:
    return RetryPolicy(attempts=3, base_s=0.01, cap_s=0.05)


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real endpoint or token leaks into a test from the environment."""
    monkeypatch.delenv("MODELSCOPE_ENDPOINT", raising=False)
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    logging.getLogger("gguf-serve-fetch").setLevel(logging.INFO)


def sha256_of(path: Path) -> str:
    return sha256_file(path)


def write_tiny_gguf(path: Path, arch: str, nextn: int | None) -> Path:
    """A few-KB GGUF with one tensor; `nextn` None leaves <arch>.nextn_predict_layers out."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_block_count(2)
    w.add_context_length(4096)
    if nextn is not None:
        w.add_nextn_predict_layers(nextn)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(2000)])
    w.add_array("tiny.short_list", [1, 2, 3])
    w.add_float32("tiny.scale", 0.5)
    w.add_bool("tiny.flag", True)
    w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
