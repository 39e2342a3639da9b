"""Fixtures shared by every test tier."""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import stacks  # noqa: F401 - loaded before any test module imports aws_cdk: it silences jsii's Node banner
from gguf_serve.local.cache import cache_root
from gguf_serve.local.demo import source_gguf
from gguf_serve.local.hub import LocalScope

ROOT = Path(__file__).resolve().parent.parent
# The test tiers, one registered marker each (pyproject.toml); a test without one is `fast`.
TIERS = ("e2e", "cli", "scan", "fresh", "images", "arm64", "cuda", "rehearsal")


@pytest.hookimpl(tryfirst=True)  # before -m selects: the `fast` marker must be there when it does
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is in tiers {tiers}: a test belongs to one tier")
        if not tiers:
            item.add_marker(pytest.mark.fast)
    # The few long tests (`slow`: CLI synths, the policy scanners) first, so that with -n 2 they run beside the
    # many short ones instead of after them; otherwise the collection order (a stable sort).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def cdk_context() -> dict:
    """The context `cdk synth` sees: cdk.json flags plus pinned cdk.context.json (pytest's App reads neither),
    with the tests' model lock, in which synth's own lookup locked the 27B from the local hub
    (tests/catalog/stand_in.py), and no further lookups: no test reaches for ModelScope
    (tests/stacks/test_first_synth_lock.py does, on purpose). The 35B's sha256 stays typed there, so the tests
    deploy it on purpose (allowTypedLock), as a user without the hub would."""
    from stacks.app import MODEL_LOCK_CONTEXT, MODEL_LOOKUP_CONTEXT, cli_context

    return {
        **cli_context(),
        MODEL_LOCK_CONTEXT: str(_pinned_lock()),
        MODEL_LOOKUP_CONTEXT: "false",
        "allowTypedLock": "true",
    }


@functools.cache
def _pinned_lock() -> Path:
    import tempfile

    from tests.catalog.stand_in import stand_in_lock

    return stand_in_lock(Path(tempfile.mkdtemp(prefix="model-lock-")))


@pytest.fixture(scope="session")
def whole_apps(tmp_path_factory: pytest.TempPathFactory):
    """The fast tier's three whole-app option sets (tests/whole_app.py), each synthesized once per session."""
    from tests.whole_app import WholeApps, shared_folder

    return WholeApps(shared_folder(tmp_path_factory), cdk_context)


@pytest.fixture(scope="session", autouse=True)
def _whole_apps_shared_out(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Under pytest-xdist, before its first test, each worker synthesizes its share of the option sets when the
    session's tests read any: the workers make them side by side instead of one waiting for a set another is making
    (26 s of a worker's time in a fast tier on an empty cache)."""
    import os

    from tests.whole_app import WholeApps, share, shared_folder

    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2 or not any("whole_apps" in item.fixturenames for item in request.session.items):
        return
    apps = WholeApps(shared_folder(tmp_path_factory), cdk_context)
    for name in share(int(worker.removeprefix("gw")), count):
        apps[name]


SMALL_REPO = "test/small-GGUF"
SMALL_FILE = "small.bin"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LocalScope]:
    """A fresh local ModelScope (no faults) serving tmp_path/hub/<owner>/<repo>/<files>."""
    root = tmp_path / "hub"
    root.mkdir()
    with LocalScope(root) as scope:
        yield scope


@pytest.fixture
def small_file(hub: LocalScope) -> tuple[Path, str]:
    """A 5 MiB random file in the hub (repo test/small-GGUF); returns (path, sha256)."""
    d = hub.root / SMALL_REPO
    d.mkdir(parents=True)
    data = random.Random(3).randbytes(5 * 1024 * 1024 + 123)
    p = d / SMALL_FILE
    p.write_bytes(data)
    return p, hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """A real llama-server, built once from the pinned PyPI sdist and cached outside the checkout."""
    from gguf_serve.local.demo import llama_server_binary as build

    path = build()  # the build script's progress and errors go to stderr, which pytest shows on failure
    assert path.is_file(), path
    return path


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF assembled from its PyPI packages (sha256-checked by the package)."""
    return source_gguf(cache_root())


@pytest.fixture(scope="session")
def serving_process(llama_server_binary: Path, gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real llama-server for the session, started through `gguf-serve-launch serve` with the local profile.

    Yields the launcher's ServerProcess; its `statuses` holds every /health answer seen from process start.
    """
    import secrets

    from gguf_serve.local.process import free_port, start_server
    from tests.committed import local_profile

    server = start_server(
        local_profile(port=free_port()),
        gemma_gguf.parent,
        binary=llama_server_binary,
        api_key=secrets.token_urlsafe(24),
        workdir=tmp_path_factory.mktemp("llama"),
    )
    try:
        server.wait_healthy(timeout=120, interval=0.02)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def local_server(serving_process):
    """A real llama-server on loopback with the local profile's settings and an API key; yields (url, key)."""
    return serving_process.url, serving_process.api_key
