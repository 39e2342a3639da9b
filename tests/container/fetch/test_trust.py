"""The trust root is the pinned sha256 (or, unpinned, ModelScope's listing): never a marker or cache object alone.

Driven as an instance runs it: `gguf-serve-fetch` against a local ModelScope on loopback and moto's S3.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.container.fetch import FileSpec, fetch_file
from gguf_serve.container.fetch.ranged import MIB
from gguf_serve.local.hub import LocalScope
from tests.container.fetch.conftest import sha256_of
from tests.container.fetch.test_s3cache import BUCKET, s3  # noqa: F401 - the moto fixture

ROOT = Path(__file__).resolve().parents[3]
NAME = "model.gguf"


def fetch_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.fetch", "--quiet", *args], cwd=ROOT, capture_output=True,
        text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def put(hub: LocalScope, repo: str, seed: int, size: int = 2 * MIB + 7) -> str:
    data = random.Random(seed).randbytes(size)
    (hub.root / repo).mkdir(parents=True)
    (hub.root / repo / NAME).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_another_repos_file_of_the_same_name_is_not_served_as_verified(hub: LocalScope, tmp_path: Path) -> None:
    put(hub, "owner/repo", 1)
    sha2 = put(hub, "owner/repo2", 2)
    dest = str(tmp_path / "models")
    first = fetch_cli("--repo", "owner/repo", "--file", NAME, "--dest", dest, "--endpoint", hub.url)
    assert first.returncode == 0, first.stderr
    other = fetch_cli("--repo", "owner/repo2", "--file", NAME, "--dest", dest, "--endpoint", hub.url)
    assert other.returncode == 0, other.stderr
    summary = json.loads(other.stdout)
    assert summary["source"] == "modelscope" and summary["sha256"] == sha2
    assert sha256_of(tmp_path / "models" / NAME) == sha2
    marker = json.loads((tmp_path / "models" / f".{NAME}.verified").read_text())
    assert (marker["repo"], marker["revision"], marker["file"]) == ("owner/repo2", "master", NAME)


def test_a_revision_that_does_not_exist_is_not_served_from_disk(tmp_path: Path) -> None:
    with LocalScope(tmp_path / "hub", revisions=("master",)) as hub:
        put(hub, "owner/repo", 1)
        dest = str(tmp_path / "models")
        assert fetch_cli("--repo", "owner/repo", "--file", NAME, "--dest", dest, "--endpoint", hub.url).returncode == 0
        gone = fetch_cli("--repo", "owner/repo", "--file", NAME, "--revision", "v9", "--dest", dest,
                         "--endpoint", hub.url)  # fmt: skip
    assert gone.returncode == 1 and gone.stdout == ""
    assert "revision v9 not found" in gone.stderr and "Traceback" not in gone.stderr


def test_a_valid_copy_without_its_marker_is_kept_not_downloaded_again(hub: LocalScope, tmp_path: Path) -> None:
    sha = put(hub, "owner/repo", 1)
    dest = tmp_path / "models"
    args = ("--repo", "owner/repo", "--file", NAME, "--dest", str(dest), "--endpoint", hub.url)
    assert fetch_cli(*args).returncode == 0
    (dest / f".{NAME}.verified").unlink()
    hub.stats.reset()
    again = fetch_cli(*args)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["source"] == "local" and hub.stats.downloads() == []
    assert json.loads((dest / f".{NAME}.verified").read_text())["sha256"] == sha


def test_a_wrong_copy_is_removed_before_the_space_check(hub: LocalScope, tmp_path: Path) -> None:
    """A disk with room for one copy: the old, wrong file must not count against the new one."""
    sha = put(hub, "owner/repo", 1, size=8 * MIB)
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / NAME).write_bytes(random.Random(9).randbytes(8 * MIB))  # same name and size, other bytes, no marker
    capacity = 8 * MIB + 64 * MIB + MIB  # the file, modelfetch's headroom, a little more

    def free(path: Path) -> int:
        used = sum(p.lstat().st_blocks * 512 for p in path.iterdir())
        return capacity - used

    r = fetch_file(FileSpec("owner/repo", NAME), dest, endpoint=hub.url, free_space=free, progress=False)
    assert r.source == "modelscope" and sha256_of(r.path) == sha


def test_unpinned_file_never_trusts_the_s3_cache(s3, hub: LocalScope, tmp_path: Path,  # noqa: F811
                                                 caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """One bad instance plants a self-consistent object (its metadata hashes its own bytes)."""
    sha = put(hub, "owner/repo", 1)
    planted = b"GGUF" + random.Random(7).randbytes(4096)
    s3.put_object(Bucket=BUCKET, Key=f"owner/repo/master/{NAME}", Body=planted,
                  Metadata={"sha256": hashlib.sha256(planted).hexdigest()})  # fmt: skip
    r = fetch_file(FileSpec("owner/repo", NAME), tmp_path, endpoint=hub.url, s3_cache=f"s3://{BUCKET}", progress=False)
    assert r.source == "modelscope" and sha256_of(r.path) == sha and r.cached_to is None
    assert "pins no sha256" in caplog.text and "not using the S3 cache" in caplog.text
    body = s3.get_object(Bucket=BUCKET, Key=f"owner/repo/master/{NAME}")["Body"].read()
    assert body == planted  # nor written: an unpinned download is not a reference for anyone


def test_pinned_file_checks_the_cache_against_the_pin_not_its_metadata(s3, hub: LocalScope,  # noqa: F811
                                                                       tmp_path: Path) -> None:  # fmt: skip
    sha = put(hub, "owner/repo", 1)
    planted = random.Random(7).randbytes(2 * MIB + 7)  # the pinned size, and metadata claiming the pinned hash
    s3.put_object(Bucket=BUCKET, Key=f"owner/repo/master/{NAME}", Body=planted, Metadata={"sha256": sha})
    spec = FileSpec("owner/repo", NAME, sha256=sha, size=len(planted))
    r = fetch_file(spec, tmp_path, endpoint=hub.url, s3_cache=f"s3://{BUCKET}", part_size=MIB, progress=False)
    assert r.source == "modelscope" and sha256_of(r.path) == sha
