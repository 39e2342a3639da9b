"""modelfetch against the local hub: happy path, faults, corruption, permanent errors, disk space."""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gguf_serve.container.fetch import (
    AuthError,
    DiskSpaceError,
    FetchError,
    FileSpec,
    IntegrityError,
    NotFoundError,
    fetch_file,
    fetch_model,
)
from gguf_serve.container.fetch.ranged import MIB, partial_path, state_path
from gguf_serve.container.fetch.retry import RetryPolicy
from gguf_serve.local.hub import LocalScope
from tests.committed import GEMMA3_270M
from tests.conftest import SMALL_FILE, SMALL_REPO
from tests.container.fetch.conftest import sha256_of


def _leftovers(dest: Path, name: str) -> list[str]:
    return sorted(p.name for p in dest.iterdir() if p.name.startswith(name) or p.name.startswith(f".{name}"))


def test_gemma_happy_path(gemma_hub: LocalScope, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    r = fetch_file(FileSpec.from_artifact(GEMMA3_270M), dest, endpoint=gemma_hub.url, connections=4,
                   part_size=16 * MIB, progress=False)  # fmt: skip
    path = r.path
    assert path == dest / GEMMA3_270M.file
    assert sha256_of(path) == GEMMA3_270M.sha256
    assert not partial_path(path).exists() and not state_path(path).exists()
    downloads = gemma_hub.stats.downloads()
    # One ranged request per part, plus one per range split at the end (ranged.py); past a split, only the bytes
    # already in flight when the old owner closed its stream are sent twice.
    assert len(downloads) == -(-GEMMA3_270M.size_bytes // (16 * MIB)) + r.splits
    assert r.transferred == GEMMA3_270M.size_bytes
    assert GEMMA3_270M.size_bytes <= gemma_hub.stats.bytes_sent <= GEMMA3_270M.size_bytes + r.splits * 16 * MIB
    assert r.splits or gemma_hub.stats.bytes_sent == GEMMA3_270M.size_bytes  # without a split, every byte once
    assert all(q["status"] == 206 and q["range"] for q in downloads)
    # A second run finds the verified copy and downloads nothing.
    gemma_hub.stats.reset()
    again = fetch_file(FileSpec.from_artifact(GEMMA3_270M), dest, endpoint=gemma_hub.url, progress=False)
    assert again.source == "local" and again.transferred == 0 and gemma_hub.stats.requests == []
    assert again.gguf is not None and again.gguf.architecture == "gemma3" and not again.gguf.has_mtp_layers


def test_endpoint_from_environment(gemma_hub: LocalScope, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", gemma_hub.url)
    r = fetch_file(FileSpec.from_artifact(GEMMA3_270M), tmp_path, connections=8, progress=False)
    assert r.source == "modelscope" and r.sha256 == GEMMA3_270M.sha256 and r.transferred == GEMMA3_270M.size_bytes


def test_unpinned_sha_comes_from_the_listing(hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path) -> None:
    _, sha = small_file
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, part_size=MIB, progress=False)
    assert r.sha256 == sha and sha256_of(r.path) == sha


@pytest.mark.parametrize("rst", [True, False], ids=["rst", "short-body"])
def test_transient_503_and_resets_are_retried(
    rst: bool, hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path, fast_retry: RetryPolicy
) -> None:
    _, sha = small_file
    # Faults hit every 3rd/4th request across all connections, so one range can meet several in a row.
    patient = RetryPolicy(attempts=12, base_s=fast_retry.base_s, cap_s=fast_retry.cap_s)
    hub.faults.fail_every = 3
    hub.faults.reset_every = 4
    hub.faults.reset_after_bytes = 300_000
    hub.faults.reset_with_rst = rst
    r = fetch_file(
        FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, connections=3, part_size=MIB,
        retry=patient, progress=False,
    )  # fmt: skip
    assert sha256_of(r.path) == sha
    injected = [d.get("injected") for d in hub.stats.downloads()]
    assert "503" in injected and "reset" in injected
    if rst:
        return
    # Bytes that arrived before the drop were kept: the retry asks for the rest of the part only.
    part_starts = {f"bytes={i * MIB}-" for i in range(6)}
    assert any(d["range"] and not any(d["range"].startswith(s) for s in part_starts) for d in hub.stats.downloads())


def test_corrupt_byte_is_detected_and_refetched(
    gemma_hub: LocalScope, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gemma_hub.faults.corrupt_offset = 100_000_000  # flipped in the first body that covers it, then clean
    with caplog.at_level(logging.WARNING, logger="gguf-serve-fetch"):
        r = fetch_file(FileSpec.from_artifact(GEMMA3_270M), tmp_path, endpoint=gemma_hub.url, connections=8,
                       progress=False)  # fmt: skip
    assert sha256_of(r.path) == GEMMA3_270M.sha256
    assert "sha256 mismatch" in caplog.text
    sent, twice = gemma_hub.stats.bytes_sent, 2 * GEMMA3_270M.size_bytes  # no per-range hashes upstream: all again
    assert twice <= sent <= twice + r.splits * 16 * MIB  # and the bytes in flight at each split (test_gemma_happy_path)


def test_persistent_corruption_never_reaches_the_final_name(
    hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path
) -> None:
    _, sha = small_file
    hub.faults.corrupt_offset = 4321
    hub.faults.corrupt_times = None
    spec = FileSpec(SMALL_REPO, SMALL_FILE, sha256=sha)
    with pytest.raises(IntegrityError, match="sha256 mismatch.*after 2 downloads"):
        fetch_file(spec, tmp_path, endpoint=hub.url, part_size=MIB, progress=False)
    assert not (tmp_path / SMALL_FILE).exists()
    assert _leftovers(tmp_path, SMALL_FILE) == [f".{SMALL_FILE}.lock"]  # no partial, no state, no marker


def test_pinned_hash_that_upstream_no_longer_has(hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path) -> None:
    spec = FileSpec(SMALL_REPO, SMALL_FILE, sha256="0" * 64)
    with pytest.raises(IntegrityError, match="changed upstream"):
        fetch_file(spec, tmp_path, endpoint=hub.url, progress=False)
    assert hub.stats.downloads() == []


def test_missing_repo_and_file(hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="nobody/nothing"):
        fetch_file(FileSpec("nobody/nothing", "x.gguf"), tmp_path, endpoint=hub.url, progress=False)
    with pytest.raises(NotFoundError, match=f"missing.gguf is not in .*it has: {SMALL_FILE}"):
        fetch_file(FileSpec(SMALL_REPO, "missing.gguf"), tmp_path, endpoint=hub.url, progress=False)
    assert hub.stats.downloads() == []


def test_unauthorized(
    hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.faults.token = "right-token"
    with pytest.raises(AuthError, match="401.*MODELSCOPE_API_TOKEN"):
        fetch_file(FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, progress=False)
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "right-token")
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, progress=False)
    assert sha256_of(r.path) == small_file[1]


def test_retries_give_up_with_a_clear_error(
    hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path, fast_retry: RetryPolicy
) -> None:
    hub.faults.fail_every = 1  # every download answers 503
    with pytest.raises(FetchError, match="failed 4 times in a row, last: HTTP 503"):
        fetch_file(
            FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, part_size=MIB, retry=fast_retry,
            progress=False,
        )  # fmt: skip
    assert not (tmp_path / SMALL_FILE).exists()
    assert state_path(tmp_path / SMALL_FILE).exists()  # kept: the next run resumes


def test_disk_too_small_fails_before_downloading(gemma_hub: LocalScope, tmp_path: Path) -> None:
    with pytest.raises(DiskSpaceError, match=r"needs 305\.4 MiB .* only 100\.0 MiB is free"):
        fetch_model(GEMMA3_270M, tmp_path, endpoint=gemma_hub.url, progress=False, free_space=lambda _: 100 * MIB)
    assert gemma_hub.stats.requests == []


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    """A real 64 MiB filesystem, when this runner may mount one (root in a container that allows it)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_too_small_on_a_real_filesystem(gemma_hub: LocalScope, tiny_tmpfs: Path) -> None:
    with pytest.raises(DiskSpaceError, match="not enough disk space"):
        fetch_model(GEMMA3_270M, tiny_tmpfs, endpoint=gemma_hub.url, progress=False)
    assert gemma_hub.stats.downloads() == []


def test_catalog_size_is_only_an_estimate_when_unpinned(gemma_hub: LocalScope, tmp_path: Path) -> None:
    unpinned = replace(GEMMA3_270M, sha256=None, size_bytes=200_000_000)  # like the 27B entry
    path = fetch_model(unpinned, tmp_path, endpoint=gemma_hub.url, progress=False)
    assert sha256_of(path) == GEMMA3_270M.sha256


def test_redirect_to_storage_like_the_hub(
    hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ModelScope answers 302 to signed storage URLs: ranges follow the redirect, the token does not leave the hub."""
    _, sha = small_file
    hub.faults.token = "hub-token"
    hub.faults.redirect_to = hub.url.replace("127.0.0.1", "localhost")  # another host name, as storage is
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "hub-token")
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, part_size=MIB, progress=False)
    assert sha256_of(r.path) == sha
    kinds = [q["kind"] for q in hub.stats.requests]
    # The first redirect's storage URL serves the later ranges (a worker may ask the hub before one came back).
    assert 1 <= kinds.count("redirect") <= 8 and len(hub.stats.downloads()) == 6  # one download per 1 MiB part
    assert all(not q["credentials"] for q in hub.stats.downloads())  # the token stayed on the hub
    assert all("sig=" in d["path"] and d["status"] == 206 for d in hub.stats.downloads())
    assert all(d["host"].startswith("localhost:") and not d["credentials"] for d in hub.stats.downloads())
    assert all(q["credentials"] for q in hub.stats.requests if q["kind"] in ("listing", "redirect"))


def test_an_expired_storage_url_is_asked_for_again(
    hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path
) -> None:
    _, sha = small_file
    hub.faults.redirect_to = hub.url.replace("127.0.0.1", "localhost")
    hub.faults.signed_url_uses = 2  # then 403, as an expired signature is
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, connections=1, part_size=MIB,
                   progress=False)  # fmt: skip
    assert sha256_of(r.path) == sha
    kinds = [q["kind"] for q in hub.stats.requests]
    assert kinds.count("expired") == 2 and kinds.count("redirect") == 3  # 6 parts, 2 per signature


LISTED_COMMIT = "0" * 40  # the commit the local hub lists for every file


@pytest.mark.parametrize("serves_commits", [True, False], ids=["commit-revision", "branch-at-the-commit"])
def test_the_locked_commit_is_what_is_fetched(gemma_gguf: Path, tmp_path: Path, serves_commits: bool, caplog) -> None:
    artifact = replace(GEMMA3_270M, commit=LISTED_COMMIT)
    with LocalScope(revisions=None if serves_commits else ("master",)) as hub:
        hub.add_file(artifact.repo, artifact.file, gemma_gguf)
        path = fetch_model(artifact, tmp_path, endpoint=hub.url, connections=2, progress=False)
        asked = [r["path"] for r in hub.stats.requests]
    assert sha256_of(path) == artifact.sha256
    at = f"Revision={LISTED_COMMIT}"
    if serves_commits:  # never the branch: the listing and every byte at the commit
        assert asked and all(at in p or "/resolve/" + LISTED_COMMIT in p for p in asked), asked
    else:  # refused at the commit (404), then the branch, which still lists the file at that commit
        assert at in asked[0] and all("Revision=master" in p or "/resolve/master/" in p for p in asked[1:]), asked
        assert f"does not serve commit {LISTED_COMMIT} as a revision" in caplog.text


def test_a_branch_that_moved_past_the_locked_commit_fetches_nothing(gemma_hub: LocalScope, tmp_path: Path) -> None:
    gemma_hub.revisions = ("master",)
    artifact = replace(GEMMA3_270M, commit="1" * 40)
    with pytest.raises(IntegrityError, match=r"locked commit 1{40}.*master now lists the file at commit 0{40}"):
        fetch_model(artifact, tmp_path / "models", endpoint=gemma_hub.url, connections=2, progress=False)
    assert gemma_hub.stats.downloads() == []
    assert not (tmp_path / "models" / artifact.file).exists()
