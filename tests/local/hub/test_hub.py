"""The local hub answers like ModelScope: listing envelope, ranges, errors, faults, and the official CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gguf_serve.local.hub import LocalScope
from tests.conftest import SMALL_FILE, SMALL_REPO
from tests.container.fetch.conftest import sha256_of


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_listing_has_modelscope_shape(hub: LocalScope, small_file: tuple[Path, str]) -> None:
    path, sha = small_file
    status, _, body = _get(f"{hub.url}/api/v1/models/{SMALL_REPO}/repo/files?Revision=master&Recursive=True")
    assert status == 200
    doc = json.loads(body)
    assert doc["Code"] == 200 and doc["Success"] is True and doc["RequestId"]
    [entry] = doc["Data"]["Files"]
    assert entry["Path"] == SMALL_FILE and entry["Type"] == "blob"
    assert entry["Size"] == path.stat().st_size and entry["Sha256"] == sha


def test_ranges_on_both_download_urls(hub: LocalScope, small_file: tuple[Path, str]) -> None:
    data = small_file[0].read_bytes()
    size = len(data)
    for url in (
        f"{hub.url}/api/v1/models/{SMALL_REPO}/repo?Revision=master&FilePath={SMALL_FILE}",
        f"{hub.url}/models/{SMALL_REPO}/resolve/master/{SMALL_FILE}",
    ):
        status, headers, body = _get(url, {"Range": "bytes=100-199"})
        assert (status, body, headers["Content-Range"]) == (206, data[100:200], f"bytes 100-199/{size}")
        status, headers, body = _get(url, {"Range": "bytes=-10"})
        assert (status, body) == (206, data[-10:])
        status, headers, body = _get(url)
        assert status == 200 and body == data and headers["Accept-Ranges"] == "bytes"
        status, headers, _ = _get(url, {"Range": f"bytes={size}-"})
        assert status == 416 and headers["Content-Range"] == f"bytes */{size}"


def test_not_found_in_modelscope_shape(hub: LocalScope, small_file: tuple[Path, str]) -> None:
    status, _, body = _get(f"{hub.url}/api/v1/models/nobody/nothing/repo/files?Revision=master")
    doc = json.loads(body)
    assert status == 404 and doc["Success"] is False and doc["Code"] != 200 and "not found" in doc["Message"]
    status, _, body = _get(f"{hub.url}/api/v1/models/{SMALL_REPO}/repo?Revision=master&FilePath=missing.gguf")
    assert status == 404 and json.loads(body)["Success"] is False


def test_token_required(hub: LocalScope, small_file: tuple[Path, str]) -> None:
    hub.faults.token = "s3cret"
    url = f"{hub.url}/api/v1/models/{SMALL_REPO}/repo/files?Revision=master"
    assert _get(url)[0] == 401
    assert _get(url, {"Authorization": "Bearer s3cret"})[0] == 200
    assert _get(url, {"Cookie": "m_session_id=s3cret"})[0] == 200


def test_bandwidth_cap_and_corruption(hub: LocalScope, small_file: tuple[Path, str]) -> None:
    data = small_file[0].read_bytes()
    hub.faults.bandwidth_bps = 10e6
    hub.faults.corrupt_offset = 1234
    url = f"{hub.url}/models/{SMALL_REPO}/resolve/master/{SMALL_FILE}"
    t0 = time.monotonic()
    _, _, body = _get(url, {"Range": "bytes=0-2999999"})
    assert time.monotonic() - t0 >= 0.28  # 3 MB at 10 MB/s
    assert body[1234] == data[1234] ^ 0xFF and body[:1234] == data[:1234] and body[1235:] == data[1235:3000000]
    hub.faults.bandwidth_bps = None
    assert _get(url, {"Range": "bytes=0-2999"})[2] == data[:3000]  # corrupt_times=1: the next body is clean


def test_injected_503_and_reset(hub: LocalScope, small_file: tuple[Path, str]) -> None:
    hub.faults.fail_every = 2
    url = f"{hub.url}/models/{SMALL_REPO}/resolve/master/{SMALL_FILE}"
    assert _get(url, {"Range": "bytes=0-9"})[0] == 206
    assert _get(url, {"Range": "bytes=0-9"})[0] == 503
    hub.faults.fail_every = 0
    hub.faults.reset_every = 1
    hub.faults.reset_after_bytes = 1000
    with pytest.raises((ConnectionError, urllib.error.URLError, OSError)):
        _get(url)
    assert hub.stats.downloads()[-1]["injected"] == "reset"


def test_official_modelscope_cli_downloads_from_it(
    hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path
) -> None:
    """modelscope 1.40.2 `download --include` (which checks size and sha256) works against localscope."""
    path, sha = small_file
    out = tmp_path / "out"
    env = {
        **os.environ,
        "MODELSCOPE_ENDPOINT": hub.url,
        "MODELSCOPE_CACHE": str(tmp_path / "mscache"),
        "MODELSCOPE_DOWNLOAD_PARALLEL_WORKERS": "4",
        "MODELSCOPE_DOWNLOAD_PARALLEL_THRESHOLD_MB": "1",
        "MODELSCOPE_DOWNLOAD_PART_SIZE_MB": "1",
    }
    cli = Path(sys.executable).with_name("modelscope")
    proc = subprocess.run(
        [str(cli), "download", "--model", SMALL_REPO, "--include", SMALL_FILE, "--local_dir", str(out)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sha256_of(out / SMALL_FILE) == sha
    kinds = {r["kind"] for r in hub.stats.requests}
    assert {"listing", "download"} <= kinds
    ranged = [r for r in hub.stats.downloads() if r["range"]]
    assert len(ranged) >= 4  # it really used parallel ranges against us


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/models/%2E%2E/%2E%2E/repo?Revision=master&FilePath={tmp}/secret.txt",
        "/api/v1/models/%2E%2E/outside/repo?Revision=master&FilePath=secret.txt",
        "/models/%2E%2E/outside/resolve/master/secret.txt",
        "/api/v1/models/%2E%2E/outside/repo/files?Revision=master",
    ],
)
def test_encoded_dot_dot_does_not_leave_the_root(path: str, tmp_path: Path) -> None:
    """Files beside the served root must stay unreachable, however the path is encoded."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("not for you\n")
    (tmp_path / "secret.txt").write_text("not for you\n")
    root = tmp_path / "hub"
    (root / "o" / "r").mkdir(parents=True)
    with LocalScope(root) as scope:
        status, _, body = _get(scope.url + path.format(tmp=tmp_path.name))
    assert status == 404 and b"not for you" not in body and b"secret.txt" not in body
