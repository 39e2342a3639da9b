"""`gguf-serve-workstation check` and `up`'s refusals, as the user runs them (real processes, no GPU here)."""

from __future__ import annotations

import os
import subprocess
import sys

from gguf_serve.local.process import PACKAGE_ROOT, free_ports


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


def test_up_native_refuses_a_taken_port_before_starting_anything(tmp_path):
    import socket

    port, prom_port = free_ports(2)
    with socket.socket() as taken:  # llama-server's default port, --port + 1, already held by something else
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", port + 1))
        except OSError:
            taken.close()  # held already: that is the case under test too
        out = run("up", "rtx4090-mtp", "--native", "--cpu", "--skip-fetch", "--work-dir", str(tmp_path / "w"),
                  "--port", str(port), "--prometheus-port", str(prom_port))  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip() == f"workstation: 127.0.0.1:{port + 1} is in use: choose another --server-port " \
        "(llama-server; default --port + 1)"  # fmt: skip
    assert not (tmp_path / "w").exists()  # refused before any file was written
