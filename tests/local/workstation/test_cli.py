"""`gguf-serve-workstation check` and `up`'s refusals, as the user runs them (real processes, no GPU here)."""

from __future__ import annotations

import os
import subprocess
import sys

from gguf_serve.local.process import PACKAGE_ROOT


def run(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "gguf_serve.local.workstation", *args], cwd=PACKAGE_ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_check_prints_the_card_table():
    out = run("check")
    assert out.returncode == 0, out.stderr
    rows = out.stdout
    assert (
        "| rtx-3060-12gb (12 GB) | Qwen3.6-27B | does not fit: a 24 GB card fits it (rtx-4090) | 19.3 / 12.0 |" in rows
    )
    assert "| rtx-3060-12gb (12 GB) | Qwen3.6-35B-A3B | --n-cpu-moe 24 | 11.6 / 12.0 | 14.7 / 15.5 |" in rows
    assert "| rtx-4060-ti-16gb (16 GB) | Qwen3.6-35B-A3B | --n-cpu-moe 16 |" in rows
    assert "| rtx-5090 (32 GB) | Qwen3.6-35B-A3B | every layer on the GPU | 23.3 / 31.8 |" in rows
    assert "6 workstation profiles valid" in rows


def test_up_refuses_in_one_line():
    no_gpu = run("up", "rtx4090-mtp", path="/nonexistent")  # no nvidia-smi
    assert no_gpu.returncode == 1
    assert no_gpu.stderr.strip().startswith("workstation: no NVIDIA driver here") and "--cpu" in no_gpu.stderr
    assert len(no_gpu.stderr.strip().splitlines()) == 1
    unknown = run("up", "rtx9090")
    assert unknown.returncode == 1 and "no workstation profile 'rtx9090'" in unknown.stderr
    assert "rtx4090-mtp" in unknown.stderr
    cpu = run("up", "rtx4090-mtp", "--cpu")
    assert cpu.returncode == 1 and "--cpu runs llama-server on this machine's CPU: it needs --native" in cpu.stderr
