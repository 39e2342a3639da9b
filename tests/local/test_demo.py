"""The embedded default, run as `make demo` runs it: build or reuse, fetch through the hub, serve, chat, stop."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_local_runner_prints_an_answer_and_its_speed(llama_server_binary, gemma_gguf, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
    out = subprocess.run(
        [sys.executable, "-m", "gguf_serve.local.demo", "--max-tokens", "12", "--work-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for step in ("[1/5] llama-server:", "[2/5] fetch:", "verified", "[3/5] start: profile 'local-graviton-moe'",
                 "[4/5] health:", "answered 200", "[5/5] chat:", "[done] llama-server stopped"):  # fmt: skip
        assert step in text, text
    m = re.search(r"(\d+) tokens in ([0-9.]+) s: ([0-9.]+) tok/s generation \(server timings\), ([0-9.]+) tok/s", text)
    assert m, text
    assert int(m.group(1)) > 0 and float(m.group(3)) > 0
    assert (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").stat().st_size == gemma_gguf.stat().st_size
    assert "LLAMA_API_KEY" not in (tmp_path / "server.log").read_text()
