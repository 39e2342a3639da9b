"""Fixtures for the serving tier: tiny GGUF files, a sentinel llama-server, and a launcher invocation."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gguf_serve.catalog import ServingProfile
from gguf_serve.local.process import launch_command, launcher_env


@pytest.fixture
def make_gguf(tmp_path: Path) -> Callable[..., Path]:
    """Write a tiny but valid GGUF (one 4-float tensor) with the given architecture and MTP layer count."""
    import numpy as np
    from gguf import GGUFWriter

    def make(name: str, arch: str, nextn_predict_layers: int | None = 0, directory: Path | None = None) -> Path:
        path = (directory or tmp_path / "models") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        w = GGUFWriter(str(path), arch)
        w.add_block_count(1)
        if nextn_predict_layers is not None:
            w.add_uint32(f"{arch}.nextn_predict_layers", nextn_predict_layers)
        w.add_tensor("token_embd.weight", np.zeros(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    return make


@pytest.fixture
def sentinel_binary(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in llama-server that records its argv and environment: proof of whether it was started."""
    record = tmp_path / "sentinel-ran"
    script = tmp_path / "llama-server"
    script.write_text(f'#!/bin/sh\n{{ printf "%s\\n" "$@"; echo ---; env; }} > "{record}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, record


@pytest.fixture
def run_launcher(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """Run `gguf-serve-launch serve` for a profile as the container would; returns the finished process."""

    def run(
        profile: ServingProfile,
        model_dir: Path,
        binary: Path,
        *,
        api_key: str | None = "test-key",
        no_api_key: bool = False,
        extra_env: dict[str, str] | None = None,
        profile_text: str | None = None,
        benchmark: bool = False,
    ) -> subprocess.CompletedProcess:
        profile_path = tmp_path / "runtime.json"
        profile_path.write_text(profile_text if profile_text is not None else profile.runtime_json())
        cmd = launch_command(profile_path, model_dir, binary, api_key=not no_api_key, benchmark=benchmark)
        env = launcher_env(api_key, base={k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")})
        env.update(extra_env or {})
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)

    return run
