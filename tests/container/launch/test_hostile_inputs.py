"""The launcher on the boot path: crafted GGUF headers are refused with EX_CONFIG (systemd stops retrying), and
`launcher fetch` failures are one line with exit 1, never a traceback."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.container.launch import EX_CONFIG
from gguf_serve.local.hub import LocalScope
from gguf_serve.local.process import launcher_env
from tests.committed import PROFILES, local_profile

GPU = PROFILES["gpu-mtp"]


def _str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _header(kv: bytes, kv_count: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, kv_count) + kv


ARRAY, UINT32 = 9, 4
CRAFTED = {
    # an array of an array of ... 100,000 levels deep
    "deep-nesting": _header(_str(b"a") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * 100_000, 1),
    # 2^63 uint32s: a seek past any file
    "absurd-scalar-count": _header(_str(b"a") + struct.pack("<I", ARRAY) + struct.pack("<IQ", UINT32, 1 << 63), 1),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_crafted_gguf_header_is_refused_not_crashed_on(name: str, tmp_path: Path, sentinel_binary,
                                                          run_launcher) -> None:  # fmt: skip
    binary, record = sentinel_binary
    models = tmp_path / "models"
    models.mkdir()
    (models / GPU.model.local_name).write_bytes(CRAFTED[name] + b"\0" * 4096)
    result = run_launcher(GPU, models, binary)
    assert result.returncode == EX_CONFIG, result.stderr
    assert "Traceback" not in result.stderr and not record.exists()
    [line] = result.stderr.strip().splitlines()
    assert "not a readable GGUF file" in line


def _launcher_fetch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "runtime.json"
    profile.write_text(local_profile().runtime_json())
    return subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.launch", "fetch", "--spec", str(profile), *args],
        env=launcher_env(None), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """No traceback; the last line says what failed (retry warnings and argparse's usage may come before it)."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "object at 0x" not in line
    for w in words:
        assert w in line, line


def test_fetch_from_a_down_endpoint_is_one_line(tmp_path: Path) -> None:
    result = _launcher_fetch(
        tmp_path, "--model-dir", str(tmp_path / "m"), "--endpoint", "http://127.0.0.1:9", "--retries", "1"
    )
    _one_line(result, 1, "gguf-serve-launch: fetch failed", "127.0.0.1:9", "Connection refused")


def test_fetch_of_a_missing_repo_is_one_line(tmp_path: Path) -> None:
    with LocalScope(tmp_path / "hub") as hub:
        (tmp_path / "hub").mkdir(exist_ok=True)
        result = _launcher_fetch(tmp_path, "--model-dir", str(tmp_path / "m"), "--endpoint", hub.url)
    _one_line(result, 1, "gguf-serve-launch: fetch failed", "404", local_profile().model.repo)


def test_fetch_into_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "m").write_text("a file, not a folder")
    result = _launcher_fetch(tmp_path, "--model-dir", str(tmp_path / "m"), "--endpoint", "http://127.0.0.1:9")
    _one_line(result, 1, "gguf-serve-launch: fetch failed", "not a directory")


@pytest.mark.parametrize("option", [("--connections", "0"), ("--endpoint", "localhost:8080")])
def test_fetch_with_a_bad_option_is_one_line(option: tuple[str, str], tmp_path: Path) -> None:
    result = _launcher_fetch(tmp_path, "--model-dir", str(tmp_path / "m"), *option)
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr
    _one_line(result, result.returncode)
