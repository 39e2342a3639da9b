"""Local Debian mirrors made from Debian's real signed trixie release, intact or damaged the ways a mirror fails:
for docker/pick-mirror.sh (tests/images/test_pick_mirror.py) and the pre-flight's probe that runs it in CodeBuild
(tests/preflight/test_mirror_probe.py). The release and one index come from Debian's archive once per session (the
registry CI reaches)."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.images.buildspec import TEST_DEBIAN_MIRROR

INDEX = "main/binary-amd64/Packages.xz"


@pytest.fixture(scope="session")
def release(tmp_path_factory) -> Path:
    """The real dists/trixie/InRelease and the amd64 Packages.xz it names."""
    folder = tmp_path_factory.mktemp("release")
    for name in ("InRelease", INDEX):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(f"{TEST_DEBIAN_MIRROR}/dists/trixie/{name}", timeout=60) as r:
            (folder / name).write_bytes(r.read())
    return folder


def mirror(root: Path, name: str, release: Path, damage: str | None = None) -> str:
    """A mirror under root/name: intact, or with a forged signature, caught mid-sync, or empty."""
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
    """tmp_path served over HTTP on loopback: (folder, base URL)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A mirror that answers every path 200 and then never ends: /trickle/ a byte every half second, /endless/ as
    fast as the socket takes it (the two ways a download outlives any read timeout)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        trickle = self.path.startswith("/trickle/")
        chunk = b"-" if trickle else b"\0" * 65536
        try:
            while True:
                self.wfile.write(chunk)
                self.wfile.flush()
                if trickle:
                    time.sleep(0.5)
        except OSError:
            return  # the client gave up: what the bound is for

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def hostile():
    """The hostile mirror's base URL (its /trickle/ and /endless/ trees)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
