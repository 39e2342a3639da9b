"""docker/selfcheck.py, the last build step of every base image, on roots made here from this machine's own files.

The image tier runs it inside the real builds; these show that it fails a root the way a boot would have failed
(a library missing) and names what is missing, without Docker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SELFCHECK = ROOT / "docker" / "selfcheck.py"
pytestmark = pytest.mark.skipif(not shutil.which("readelf"), reason="needs binutils' readelf")


def _needed(elf: Path) -> list[str]:
    out = subprocess.run(["readelf", "-dW", str(elf)], capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def _cxx_program() -> Path:
    """Any program here linked against libstdc++ (a compiler, CMake or another C++ tool)."""
    for folder in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        for path in sorted(Path(folder).iterdir()):
            executable = path.is_file() and not path.is_symlink() and os.access(path, os.X_OK)
            if executable and path.stat().st_size < 50_000_000 and "libstdc++.so.6" in _needed(path):
                return path
    pytest.skip("no C++ program on this machine")


def _libraries(elf: Path) -> dict[str, Path]:
    """What the dynamic loader here resolves for an ELF: soname -> file."""
    libs = {}
    for line in subprocess.run(["ldd", str(elf)], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs[parts[0]] = Path(parts[2])
        elif parts and parts[0].startswith("/"):
            libs[Path(parts[0]).name] = Path(parts[0])  # the loader itself
    return libs


def _root(tmp_path: Path, *, without: str | None = None) -> Path:
    """A root laid out like the runtime roots (merged /usr, multiarch): Python and a C++ llama-server stand-in."""
    root = tmp_path / "root"
    lib = root / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (root / "usr" / "bin").mkdir()
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    for name, target in (("lib", "usr/lib"), ("lib64", "usr/lib")):
        (root / name).symlink_to(target)
    python = Path(os.path.realpath(sys.executable))
    server = _cxx_program()
    shutil.copy(python, root / "usr" / "bin" / "python3")
    shutil.copy(server, root / "usr" / "local" / "bin" / "llama-server")
    for elf in (python, server):
        for soname, path in _libraries(elf).items():
            if soname != without:
                shutil.copy(path, lib / soname)
    return root


def _selfcheck(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SELFCHECK), str(root), "--elf", "/usr/local/bin/llama-server"],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the fake root is laid out for x86_64")
def test_selfcheck_fails_a_root_without_libstdcxx_and_names_it(tmp_path):
    out = _selfcheck(_root(tmp_path, without="libstdc++.so.6"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "/usr/local/bin/llama-server needs libstdc++.so.6, which is not in the root" in out.stderr


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the fake root is laid out for x86_64")
def test_selfcheck_passes_the_same_root_with_libstdcxx(tmp_path):
    out = _selfcheck(_root(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "selfcheck: ok" in out.stdout


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the fake root is laid out for x86_64")
def test_selfcheck_refuses_a_binary_for_another_architecture(tmp_path):
    """An x86 llama-server in an arm64 root (or the reverse) is caught before any instance boots."""
    root = _root(tmp_path)
    fake = root / "usr" / "local" / "bin" / "llama-server"
    data = bytearray(fake.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine = EM_AARCH64
    fake.write_bytes(bytes(data))
    out = _selfcheck(root)
    assert out.returncode == 1 and "is built for AArch64" in out.stderr, out.stdout + out.stderr
