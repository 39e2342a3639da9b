"""docker/pick-mirror.sh against local mirrors made from Debian's real signed release: the first mirror whose
InRelease verifies against the pinned keyring and whose package index matches it wins, and the log says which
and how fast. The release and one index come from Debian's archive once per session (the registry CI reaches)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.images.buildspec import TEST_DEBIAN_MIRROR

SCRIPT = ROOT / "docker" / "pick-mirror.sh"
INDEX = "main/binary-amd64/Packages.xz"


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """The real dists/trixie/InRelease and the amd64 Packages.xz it names."""
    folder = tmp_path_factory.mktemp("release")
    for name in ("InRelease", INDEX):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(f"{TEST_DEBIAN_MIRROR}/dists/trixie/{name}", timeout=60) as r:
            (folder / name).write_bytes(r.read())
    return folder


def _mirror(root: Path, name: str, release: Path, damage: str | None = None) -> str:
    dists = root / name / "dists" / "trixie"
    shutil.copytree(release, dists)
    if damage == "signature":  # one signed character changed
        text = (dists / "InRelease").read_text().replace("Suite: stable", "Suite: stablx")
        (dists / "InRelease").write_text(text)
    elif damage == "mid-sync":  # an index the release does not name
        (dists / INDEX).write_bytes(b"\xfd7zXZ\x00 half-synced")
    elif damage == "empty":
        shutil.rmtree(root / name / "dists")
    return name


@pytest.fixture
def served(tmp_path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _pick(*mirrors: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_MIRRORS": " ".join(mirrors), "MIRROR_CONNECT_TIMEOUT_S": "5"}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_the_first_mirror_that_answers_and_verifies_wins_and_the_log_says_why(served, release):
    root, url = served
    kinds = [("empty", "empty"), ("forged", "signature"), ("syncing", "mid-sync"), ("good", None), ("later", None)]
    names = [_mirror(root, name, release, damage) for name, damage in kinds]
    out = _pick("http://127.0.0.1:9/debian", *(f"{url}/{n}" for n in names))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{url}/good"  # not "later": the list's order decides
    lines = out.stderr.splitlines()
    assert "http://127.0.0.1:9/debian: no answer for dists/trixie/InRelease" in lines[0]
    assert f"{url}/empty: no answer" in lines[1]
    assert f"{url}/forged: dists/trixie/InRelease is not signed by the pinned keyring" in lines[2]
    assert f"{url}/syncing: {INDEX} does not match its signed release" in lines[3]
    assert lines[4].startswith(f"pick-mirror: {url}/good: release signed, {INDEX} ") and "MB/s): using it" in lines[4]
    assert len(lines) == 5


def test_no_mirror_that_verifies_fails_with_what_to_change(served, release):
    root, url = served
    out = _pick(f"{url}/{_mirror(root, 'forged', release, 'signature')}")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines()[-1].endswith("set debianMirrors to one the builder reaches")
