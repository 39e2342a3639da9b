"""A tiny real GGUF laid out as SageMaker lays out the staged object, and its runtime spec."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from gguf_serve.container.server import ServerSettings
from gguf_serve.container.spec import RuntimeModel, RuntimeSpec

FILE = "tiny-Q4_K_M.gguf"
KEY_DIR = "unsloth/tiny-GGUF/master"  # the model cache's <owner>/<repo>/<revision> below the staged prefix


def write_gguf(path: Path, arch: str = "qwen35moe") -> Path:
    import numpy as np
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_uint32(f"{arch}.nextn_predict_layers", 0)
    w.add_tensor("token_embd.weight", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def spec_for(path: Path, *, arch: str = "qwen35moe") -> RuntimeSpec:
    data = path.read_bytes()
    model = RuntimeModel(
        name="Tiny", repo="unsloth/tiny-GGUF", file=FILE, revision="master", size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(), gguf_architecture=arch, has_mtp_layers=False,
    )  # fmt: skip
    return RuntimeSpec(name="tiny", model=model, server=ServerSettings(ctx_per_slot=512, parallel=2), threads=2)


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, RuntimeSpec]:
    """(/opt/ml/model as SageMaker fills it from the staged prefix, the spec that pins its one file)."""
    root = tmp_path / "opt-ml-model"
    path = write_gguf(root / KEY_DIR / FILE)
    return root, spec_for(path)


def with_model(spec: RuntimeSpec, **changes) -> RuntimeSpec:
    return replace(spec, model=replace(spec.model, **changes))
