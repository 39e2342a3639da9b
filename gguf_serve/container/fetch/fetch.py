"""Get one model file onto local disk: verified copy already there, else the S3 cache, else ModelScope."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf_serve.container.digest import sha256_file
from gguf_serve.container.fetch import gguf, safefile
from gguf_serve.container.fetch.errors import DiskSpaceError, FetchError, IntegrityError, NotFoundError
from gguf_serve.container.fetch.modelscope import ListedFile, ModelScope, resolve_endpoint
from gguf_serve.container.fetch.pace import RatePolicy
from gguf_serve.container.fetch.progress import Progress, human_bytes
from gguf_serve.container.fetch.ranged import (
    DEFAULT_PART_SIZE,
    DownloadStats,
    RangedDownload,
    RangeSource,
    partial_path,
)
from gguf_serve.container.fetch.retry import RetryPolicy
from gguf_serve.container.fetch.s3cache import CachedObject, S3Cache

if TYPE_CHECKING:
    from gguf_serve.container.spec import RuntimeModel

log = logging.getLogger("gguf-serve-fetch")

DISK_HEADROOM = 64 * 1024 * 1024  # never fill a volume to the last byte


@dataclass(frozen=True)
class FileSpec:
    """One file to fetch. `size`/`sha256` None: taken from ModelScope's listing (or the cache's metadata)."""

    repo: str
    file: str
    revision: str = "master"
    size: int | None = None
    sha256: str | None = None
    size_estimate: int | None = None  # for the early free-space check when `size` is not pinned
    commit: str | None = None  # the commit the catalog locked: asked for instead of `revision` (a branch)

    @classmethod
    def from_artifact(cls, artifact: RuntimeModel) -> FileSpec:
        pinned = artifact.sha256 is not None  # the catalog's size is exact only when the hash is pinned
        return cls(
            repo=artifact.repo,
            file=artifact.file,
            revision=artifact.revision,
            size=artifact.size_bytes if pinned else None,
            sha256=artifact.sha256.lower() if artifact.sha256 else None,
            size_estimate=artifact.size_bytes,
            commit=artifact.commit,
        )

    @property
    def local_name(self) -> str:
        return self.file.rsplit("/", 1)[-1]

    def check(self) -> None:
        """Refuse a file path that would not land inside the destination folder (".", "..", "a/", NUL)."""
        parts = self.file.split("/")
        if self.file.startswith("/") or "\x00" in self.file or any(p in ("", ".", "..") for p in parts):
            raise FetchError(f"the file to fetch must be a path inside the repo like dir/name.gguf, got {self.file!r}")


@dataclass(frozen=True)
class FetchResult:
    path: Path
    size: int
    sha256: str
    source: str  # "local" (already verified on disk), "s3" or "modelscope"
    transferred: int  # bytes received in this run
    resumed: int  # bytes kept from an interrupted run
    seconds: float
    verified_s: float  # download and hash only (no final fsync, no upload)
    cached_to: str | None  # s3:// URI written back, if any
    gguf: gguf.GGUFSummary | None
    received_s: float = 0.0  # until the last byte arrived (the network's share of verified_s)
    splits: int = 0  # ranges split at the end so that every connection kept working

    def as_dict(self) -> dict[str, Any]:
        g = self.gguf
        return {
            "path": str(self.path),
            "size": self.size,
            "sha256": self.sha256,
            "source": self.source,
            "transferred": self.transferred,
            "resumed": self.resumed,
            "seconds": round(self.seconds, 2),
            "received_seconds": round(self.received_s, 2),
            "verified_seconds": round(self.verified_s, 2),
            "splits": self.splits,
            "mb_per_s": round(self.transferred / self.seconds / 1e6, 1) if self.seconds > 0 else None,
            "cached_to": self.cached_to,
            "architecture": g.architecture if g else None,
            "nextn_predict_layers": g.nextn_predict_layers if g else None,
            "has_mtp_layers": g.has_mtp_layers if g else None,
        }


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem holding `path`."""
    return shutil.disk_usage(path).free


def fetch_model(
    artifact: RuntimeModel,
    dest: Path,
    *,
    endpoint: str | None = None,
    s3_cache: str | None = None,
    connections: int = 8,
    **options: Any,
) -> Path:
    """Fetch a catalog artifact into `dest` and return the verified file's path (see `fetch_file` for options)."""
    return fetch_file(
        FileSpec.from_artifact(artifact), dest, endpoint=endpoint, s3_cache=s3_cache, connections=connections, **options
    ).path


def fetch_file(
    spec: FileSpec,
    dest: Path,
    *,
    endpoint: str | None = None,
    s3_cache: str | S3Cache | None = None,
    connections: int = 8,
    s3_connections: int = 16,
    part_size: int = DEFAULT_PART_SIZE,
    upload: bool = True,
    token: str | None = None,
    retry: RetryPolicy | None = None,
    verify_attempts: int = 2,
    progress: bool | Progress | None = True,
    free_space: Callable[[Path], int] = free_bytes,
    rate: RatePolicy | None = None,
) -> FetchResult:
    """Make `dest/<file name>` a verified copy of `spec`, from the S3 cache when it has it, else ModelScope.

    endpoint: ModelScope base URL (default MODELSCOPE_ENDPOINT or https://www.modelscope.cn).
    s3_cache: s3://bucket/prefix of the in-region cache, or None. After a ModelScope download the file is
      uploaded there unless upload=False.
    connections: parallel ranged connections to ModelScope; s3_connections: to the cache (in-region S3 streams are
      cheap and each runs at tens of MB/s, so more of them are needed to reach the volume's write throughput).
    part_size: bytes per range request (also the unit the work is handed out in).
    progress: True for a bar on a terminal / log lines otherwise, False for none, or a Progress.
    free_space: how free bytes are measured (tests point it at a tiny fake disk).
    rate: the minimum rate and idle timeout of every body read from ModelScope (the S3 cache has its own, tighter
      bounds: s3cache.CacheBounds).

    Trust: the bytes are checked against `spec.sha256` (the catalog's pin). Without a pin, ModelScope's listing
    is the only reference: the S3 cache is neither read nor written, as any instance can write it.
    """
    t0 = time.monotonic()
    if progress:
        _ensure_log_handler()
    spec.check()
    if min(connections, s3_connections, part_size) < 1:
        raise FetchError("connections, S3 connections and the part size must be at least 1")
    dest = Path(dest)
    _prepare_dest(dest)
    target = dest / spec.local_name
    retry = retry or RetryPolicy()
    rate = rate or RatePolicy()
    hub = ModelScope(endpoint, token=token, connections=connections, retry=retry, rate=rate)
    cache = _open_cache(s3_cache, s3_connections)

    with _lock(dest / f".{spec.local_name}.lock"):
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise FetchError(
                f"{target} is a symlink or not a regular file; remove it (modelfetch writes the file itself)"
            )
        done = _already_verified(target, spec)
        listed: ListedFile | None = None
        if done is None and spec.sha256 is None and target.exists():
            # A copy without a valid marker: ModelScope's listing says whether it is this repo's file.
            listed = hub.describe(spec.repo, spec.revision, spec.file)
            done = _matches_listing(target, spec, listed)
        if done is not None:
            log.info("%s is already verified (sha256 %s); nothing to fetch", target, done[1])
            return _result(target, done[0], done[1], "local", None, t0, None, spec)

        _check_space(target, spec.size or spec.size_estimate, free_space)

        def download(
            source: RangeSource, size: int, sha256: str, connections: int, attempts: int, policy: RetryPolicy
        ) -> RangedDownload:
            _check_space(target, size, free_space)
            dl = RangedDownload(
                target,
                size=size,
                sha256=sha256,
                connections=connections,
                part_size=part_size,
                retry=policy,
                verify_attempts=attempts,
                on_progress=None,
            )
            bar = _progress(progress, f"{spec.local_name} <- {source.name}")
            if bar is not None:
                dl.on_progress = bar.update
            try:
                with _disk_errors(target):
                    dl.run(source)
            finally:
                if bar is not None:
                    bar.close()
            return dl

        # 1. The in-region cache, only against a pinned sha256: any instance can write it.
        if cache is not None and spec.sha256 is None:
            log.warning(
                "not using the S3 cache %s for %s: the profile pins no sha256, and a cache object is only trusted "
                "against a pinned one; fetching from ModelScope and checking its listed sha256 (pin `sha256` in the "
                "catalog to use the cache)", cache.uri, spec.file,
            )  # fmt: skip
            cache = None
        if cache is not None and spec.sha256 is not None:
            obj = cache.lookup(spec.repo, spec.revision, spec.file)
            if obj is not None and _cache_matches(obj, spec):
                log.info(
                    "fetching %s from the S3 cache s3://%s/%s (given up for ModelScope after %.0f s of silence)",
                    spec.file, obj.bucket, obj.key, cache.bounds.read_s_total,
                )  # fmt: skip
                try:
                    # One pass: a cache object with the wrong bytes stays wrong; ModelScope replaces it.
                    dl = download(cache.source(obj), obj.size, spec.sha256, cache.connections, 1, cache.retry)
                    return _result(target, obj.size, spec.sha256, "s3", dl, t0, None, spec)
                except DiskSpaceError:
                    raise
                except Exception as e:  # noqa: BLE001 - whatever broke the cache read, ModelScope still has the file
                    why = str(e).splitlines()[0] if str(e) else type(e).__name__
                    log.warning("S3 cache copy unusable (%s); fetching from ModelScope instead", why)

        # 2. ModelScope, at the locked commit.
        listed, at = _as_locked(hub, spec) if listed is None else (listed, spec.revision)
        size, sha = _reconcile(spec, listed.size, listed.sha256, hub.endpoint)
        log.info(
            "fetching %s@%s (%s) from %s with %d connections",
            spec.file, at, human_bytes(size), hub.endpoint, connections,
        )  # fmt: skip
        dl = download(hub.source(spec.repo, at, spec.file, size), size, sha, connections, verify_attempts, retry)

        # 3. Write back so the next instance reads in region.
        cached_to = None
        if cache is not None and upload:  # only pinned files get here (see 1.)
            try:
                t_up = time.monotonic()
                cached_to = cache.upload(target, repo=spec.repo, revision=spec.revision, file=spec.file, sha256=sha)
                log.info("uploaded %s to %s in %.0f s", target.name, cached_to, time.monotonic() - t_up)
            except Exception as e:  # noqa: BLE001 - the model is fine; the cache is an optimisation
                log.warning("could not upload %s to the S3 cache %s: %s", target.name, cache.uri, e)
        return _result(target, size, sha, "modelscope", dl, t0, cached_to, spec)


# --- helpers -------------------------------------------------------------------------------------------------------
def _result(
    target: Path,
    size: int,
    sha: str,
    source: str,
    dl: RangedDownload | None,
    t0: float,
    cached_to: str | None,
    spec: FileSpec,
) -> FetchResult:
    if source != "local":
        _write_marker(target, sha, spec)
    summary = None
    with contextlib.suppress(OSError, gguf.GGUFError):
        summary = gguf.summarize(target)
    st = dl.stats if dl is not None else DownloadStats()
    return FetchResult(
        target,
        size,
        sha,
        source,
        st.transferred,
        st.resumed,
        time.monotonic() - t0,
        st.verified_s,
        cached_to,
        summary,
        st.received_s,
        st.splits,
    )


def _prepare_dest(dest: Path) -> None:
    """The destination folder, or one line saying why it cannot be written."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise FetchError(f"--dest {dest} exists and is not a directory; point it at a folder") from None
    except OSError as e:
        raise FetchError(f"cannot create --dest {dest}: {e.strerror}; check the path and its permissions") from None
    if not os.access(dest, os.W_OK | os.X_OK):
        raise FetchError(f"cannot write to --dest {dest} (read-only or not ours); mount it writable or pick another")


def _open_cache(s3_cache: str | S3Cache | None, connections: int) -> S3Cache | None:
    """The cache on its own bounds (s3cache.CacheBounds: seconds, in region), not ModelScope's."""
    if not isinstance(s3_cache, str):
        return s3_cache
    S3Cache.check_uri(s3_cache)  # a malformed URI is the caller's mistake, not an outage
    try:
        return S3Cache(s3_cache, connections=connections)
    except Exception as e:  # noqa: BLE001 - no region or no boto3 configuration: ModelScope still works
        log.warning("S3 cache %s not usable (%s); using ModelScope only", s3_cache, e)
        return None


def _as_locked(hub: ModelScope, spec: FileSpec) -> tuple[ListedFile, str]:
    """The file as the catalog locked it, and the revision to download it at: the locked commit; a hub that does
    not serve that commit as a revision (404) is asked for the branch, whose listing must still name the locked
    commit for the file (the branch has not moved past it), else the fetch stops before downloading anything."""
    if not spec.commit:
        return hub.describe(spec.repo, spec.revision, spec.file), spec.revision
    try:
        return hub.describe(spec.repo, spec.commit, spec.file), spec.commit
    except NotFoundError as e:
        listed = hub.describe(spec.repo, spec.revision, spec.file)
        if listed.commit is not None and listed.commit != spec.commit:
            raise IntegrityError(
                f"{spec.repo}/{spec.file}: the catalog locked commit {spec.commit}, which {hub.endpoint} does not "
                f"serve ({e}), and {spec.revision} now lists the file at commit {listed.commit}; lock the model "
                f"again (`gguf-serve-catalog lock`) and redeploy"
            ) from None
        log.warning(
            "%s does not serve commit %s as a revision (%s); %s still lists %s at that commit: fetching it there",
            hub.endpoint, spec.commit, e, spec.revision, spec.file,
        )  # fmt: skip
        return listed, spec.revision


def _cache_matches(obj: CachedObject, spec: FileSpec) -> bool:
    if spec.sha256 and obj.sha256 and obj.sha256.lower() != spec.sha256:
        log.warning(
            "S3 cache holds a different %s (sha256 %s, want %s); ignoring it", spec.file, obj.sha256, spec.sha256
        )
        return False
    if spec.size is not None and obj.size != spec.size:
        log.warning("S3 cache holds %s with %d bytes, want %d; ignoring it", spec.file, obj.size, spec.size)
        return False
    return True


def _reconcile(spec: FileSpec, size: int, sha: str | None, endpoint: str) -> tuple[int, str]:
    where = f"{spec.repo}/{spec.file}@{spec.revision} on {endpoint}"
    if spec.sha256 and sha and sha.lower() != spec.sha256:
        raise IntegrityError(
            f"{where} now has sha256 {sha}, the profile pins {spec.sha256}: the file changed upstream; "
            "pin `revision` to the commit that has the pinned file, or update the catalog"
        )
    if spec.size is not None and size != spec.size:
        raise IntegrityError(f"{where} is {size} bytes, the profile pins {spec.size}; update the catalog")
    final = spec.sha256 or (sha.lower() if sha else None)
    if final is None:
        raise FetchError(f"ModelScope lists no sha256 for {where}; pin one in the catalog to verify the download")
    return size, final


def _check_space(target: Path, size: int | None, free_space: Callable[[Path], int]) -> None:
    if size is None:
        return
    part = partial_path(target)
    have = part.stat().st_blocks * 512 if part.exists() else 0  # blocks a resume already owns
    need = max(0, size - have) + DISK_HEADROOM
    free = free_space(target.parent)
    if free < need:
        raise DiskSpaceError(
            f"not enough disk space for {target.name}: it needs {human_bytes(need)} in {target.parent} "
            f"({size} bytes plus {human_bytes(DISK_HEADROOM)} headroom, less {human_bytes(have)} already "
            f"downloaded) but only {human_bytes(free)} is free; grow the volume or free space"
        )


@contextlib.contextmanager
def _disk_errors(target: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskSpaceError(f"the disk holding {target.parent} filled up while writing {target.name}") from e
        raise


def _marker(target: Path) -> Path:
    return target.with_name(f".{target.name}.verified")


def _write_marker(target: Path, sha: str, spec: FileSpec) -> None:
    """What was verified: which file of which repo and revision, and the bytes on disk (size, mtime, sha256)."""
    st = target.stat()
    doc = {"repo": spec.repo, "revision": spec.revision, "file": spec.file, "sha256": sha}
    safefile.write_text(_marker(target), json.dumps({**doc, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))


def _already_verified(target: Path, spec: FileSpec) -> tuple[int, str] | None:
    """(size, sha256) when `target` is this spec's file: its marker names the same repo, revision and file and
    the bytes are unchanged, or it re-hashes to the pinned sha256. A copy that cannot be this file is removed."""
    try:
        st = target.stat()
    except FileNotFoundError:
        return None
    if spec.size is not None and st.st_size != spec.size:
        log.warning("%s has %d bytes, expected %d; fetching it again", target, st.st_size, spec.size)
        target.unlink()
        return None
    try:
        m = json.loads(safefile.read_text(_marker(target)))
        same_file = (m["repo"], m["revision"], m["file"]) == (spec.repo, spec.revision, spec.file)
        same_bytes = m["size"] == st.st_size and m["mtime_ns"] == st.st_mtime_ns
        if same_file and same_bytes and spec.sha256 in (None, m["sha256"]):
            return st.st_size, m["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if spec.sha256 is None:
        return None  # the caller checks it against ModelScope's listing
    return _rehash(target, spec, spec.sha256)


def _matches_listing(target: Path, spec: FileSpec, listed: ListedFile) -> tuple[int, str] | None:
    """An unpinned copy without a valid marker is kept when it has the listed size and sha256."""
    if listed.sha256 is None or target.stat().st_size != listed.size:
        log.warning("%s is not %s/%s@%s as listed; removing it", target, spec.repo, spec.file, spec.revision)
        target.unlink()
        return None
    return _rehash(target, spec, listed.sha256)


def _rehash(target: Path, spec: FileSpec, sha: str) -> tuple[int, str] | None:
    log.info("verifying existing %s", target)
    if sha256_file(target) == sha:
        _write_marker(target, sha, spec)
        return target.stat().st_size, sha
    log.warning("%s does not match sha256 %s; removing it and fetching again", target, sha)
    target.unlink()  # before the download, so the free-space check does not count it twice
    return None


def _progress(progress: bool | Progress | None, label: str) -> Progress | None:
    if isinstance(progress, Progress):
        return progress
    return Progress(label) if progress else None


def _ensure_log_handler() -> None:
    """Progress lines must reach instance logs even when the caller (the launcher) configured no logging."""
    if log.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s gguf-serve-fetch %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # a root handler configured later must not print every line twice


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One fetch per file and destination at a time (two launchers racing would corrupt the partial file)."""
    try:
        fd = safefile.open_nofollow(path, os.O_RDWR | os.O_CREAT)
    except OSError as e:
        raise FetchError(f"cannot create the lock file {path}: {e.strerror}") from None
    with os.fdopen(fd, "r+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another fetch holds %s; waiting for it", path)
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


__all__ = ["FetchResult", "FileSpec", "NotFoundError", "fetch_file", "fetch_model", "free_bytes", "resolve_endpoint"]
