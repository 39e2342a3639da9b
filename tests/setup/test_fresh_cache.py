"""Every set-up step of the README's two commands, run from an empty cache in a copy of the checkout.

CI's machines may have a warm cache outside the checkout; a step that works only there (an empty `wheels/`
folder once stopped `make test` after 20 s with no message) must fail here instead. The copy holds what a
clone holds (tracked and untracked-but-not-ignored files); the pip, npm and gguf-serve caches point at
empty folders. The llama-server compile is checked by its cache key: the script downloads, verifies and
configures from the empty cache, and the entry it would fill is the one the warm build on this machine uses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.fresh, pytest.mark.slow]


def _clone_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    )  # fmt: skip
    return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(checkout copy, environment with empty caches, seconds each step took)."""
    base = tmp_path_factory.mktemp("fresh")
    copy = base / "clone"
    for rel in _clone_files():
        dest = copy / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    cache = base / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_SERVER_", "VIRTUAL_ENV", "PYTEST_"))}
    env.update(
        XDG_CACHE_HOME=str(cache),
        PIP_CACHE_DIR=str(base / "pip-cache"),
        npm_config_cache=str(base / "npm-cache"),
        PIP_NO_INPUT="1",
    )
    env.pop("PYTHONPATH", None)
    return copy, env, cache


def _run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    run = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    took = time.monotonic() - start
    tail = f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert run.returncode == 0, f"{' '.join(cmd)} failed ({run.returncode}):\n{tail}"
    return run, took


def test_setup_targets_run_from_an_empty_cache(fresh):
    copy, env, cache = fresh
    assert not cache.exists()
    timings = {}
    targets = ("prereqs", ".venv/.installed", ".venv-checkov/.installed", "node_modules/.installed", "image-sources")
    for target in targets:
        _, timings[target] = _run(["make", target], copy, env, timeout=1800)
    print("fresh-cache set-up seconds:", {k: round(v, 1) for k, v in timings.items()})

    # The venv holds the pinned app and test stack; the CDK CLI is the locked one.
    run, _ = _run([str(copy / ".venv/bin/python"), "-c", "import aws_cdk, cdk_nag, jinja2, gguf, openai; print('ok')"],
                  copy, env, timeout=120)  # fmt: skip
    assert run.stdout.strip() == "ok"
    run, _ = _run(["npx", "--no-install", "cdk", "--version"], copy, env, timeout=120)
    lock = (copy / "package-lock.json").read_text()
    assert run.stdout.split()[0] in lock, run.stdout
    # The staged image sources: the pinned sdist and every hashed wheel, in the fresh cache.
    (staged,) = (cache / "gguf-serve" / "image-sources").iterdir()  # one folder, keyed by the pins
    wheels = sorted(p.name for p in (staged / "wheels").glob("*.whl"))
    pins = (copy / "docker" / "requirements-image.txt").read_text()
    assert wheels and len(wheels) == pins.count("--hash=sha256:"), wheels
    assert list(staged.glob("llama_cpp_python-*.tar.gz"))


def test_llama_server_build_configures_from_an_empty_cache_into_the_warm_builds_entry(fresh, llama_server_binary):
    copy, env, cache = fresh
    python = copy / ".venv/bin/python"
    if not python.exists():  # the set-up test above failed or was deselected: the venv is made the same way
        _run(["make", ".venv/.installed"], copy, env, timeout=1800)
    run, took = _run(
        ["scripts/build-llama-server.sh"], copy, {**env, "PYTHON": str(python), "LLAMA_SERVER_CONFIGURE_ONLY": "1"},
        timeout=900,
    )  # fmt: skip
    entry = Path(run.stdout.strip().splitlines()[-1])
    print(f"download, verify and configure from an empty cache: {took:.1f} s -> {entry.name}")
    assert entry.parent == cache / "gguf-serve"
    # One line per stage, nothing else: the tools' own output is in the build log.
    lines = run.stderr.splitlines()
    assert lines and all(line.startswith("llama-server build: ") for line in lines), run.stderr
    assert len(lines) <= 5 and any("cpu:" in line for line in lines)  # the probe's line: which AMX path, and why
    assert "Configuring done" in (cache / "gguf-serve" / "llama-server-build.log").read_text()
    # Same sources, flags, compiler and CPU: the same cache entry as the binary the e2e tests run.
    assert entry.name == llama_server_binary.parent.parent.name
    assert (llama_server_binary.parent.parent / "BUILD-INFO").is_file()


def test_a_missing_prerequisite_fails_first_with_the_package_named(fresh, tmp_path):
    copy, env, _ = fresh
    # A PATH that has everything the commands need but cmake.
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for name in ("node", "npm", "c++", "cc", "make", "tar", "sha256sum", "curl", "bash", "env", "git", "sed", "head"):
        found = shutil.which(name, path=env["PATH"])
        if found:
            (shadow / name).symlink_to(found)
    python = subprocess.run(["python3.11", "-c", "import sys; print(sys.base_prefix)"], env=env, capture_output=True,
                            text=True, check=True).stdout.strip() + "/bin/python3.11"  # fmt: skip
    start = time.monotonic()
    run = subprocess.run(
        ["make", "test", f"PYTHON={python}"], cwd=copy, env={**env, "PATH": str(shadow)}, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode != 0 and time.monotonic() - start < 10
    lines = [line for line in run.stderr.splitlines() if line.startswith("missing prerequisite")]
    assert lines == ["missing prerequisite: cmake (Debian: apt-get install cmake)"], run.stderr
    assert "pip install" not in run.stdout + run.stderr  # nothing else started before the refusal
