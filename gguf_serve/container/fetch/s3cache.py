"""The in-region S3 model cache: look up, read in parallel ranges, write back after a verified download.

Layout: s3://<bucket>/<prefix>/<owner>/<repo>/<revision>/<file>, with user metadata
`sha256` (verified before upload) and `modelscope-repo` / `modelscope-revision` / `modelscope-file`.
Every instance of the stack may write this prefix, so nothing read from it is trusted on its own: an object is
used only for a profile that pins a sha256, and its bytes are checked against that pin while they stream (the
`sha256` metadata only lets a reader skip an object that is certainly stale). See gguf_serve.container.fetch.fetch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gguf_serve.container.fetch.errors import FetchError, NotFoundError, TransientError
from gguf_serve.container.fetch.pace import RatePolicy
from gguf_serve.container.fetch.retry import RetryPolicy

log = logging.getLogger("gguf-serve-fetch")

MIB = 1024 * 1024
CHUNK = 1024 * 1024


@dataclass(frozen=True)
class CachedObject:
    bucket: str
    key: str
    size: int
    sha256: str | None
    etag: str


@dataclass(frozen=True)
class CacheBounds:
    """How long a cache that answers nothing may hold the fetch before ModelScope takes over. The in-region cache
    answers a request in milliseconds and streams tens of MB/s per connection, so seconds of silence mean it is
    broken, not slow; ModelScope's own bounds (RatePolicy, RetryPolicy) are for a long way over the internet.

    Before: botocore's standard mode (3 attempts) times a 30 s read timeout for the head, then each stalled range
    paid that again times the fetcher's 8 attempts: about two minutes measured, more by arithmetic."""

    connect_s: float = 3.0
    read_s: float = 5.0  # one silent gap: the read timeout of the head, of each range's answer and of its body
    lookup_attempts: int = 2  # tries of the head: one lost packet does not send the fetch to ModelScope
    part_attempts: int = 3  # tries of a range without progress before the cache read ends (the fetcher's retries)
    backoff_cap_s: float = 1.0
    min_bps: float = 1024 * 1024  # per connection, averaged over window_s: a cache this slow is given up too
    window_s: float = 10.0

    @property
    def lookup_s(self) -> float:
        """The longest a silent cache's head takes to give up (each attempt: the connect, then one read)."""
        return self.lookup_attempts * (self.connect_s + self.read_s)

    @property
    def read_s_total(self) -> float:
        """The longest a silent cache's range read takes to give up: every attempt and the backoffs between."""
        return self.part_attempts * (self.connect_s + self.read_s) + (self.part_attempts - 1) * self.backoff_cap_s

    @property
    def give_up_s(self) -> float:
        """Head and read: the bound on what a silent cache costs before ModelScope starts."""
        return self.lookup_s + self.read_s_total

    def retry(self) -> RetryPolicy:
        """The fetcher's policy for the cache's ranges (its attempts count the retries after the first try)."""
        return RetryPolicy(attempts=self.part_attempts - 1, base_s=0.25, cap_s=self.backoff_cap_s)

    def rate(self) -> RatePolicy:
        return RatePolicy(min_bps=self.min_bps, window_s=self.window_s, idle_s=self.read_s, headers_s=self.read_s)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise FetchError(f"S3 cache must look like s3://bucket/prefix, got {uri!r}")
    return parts.netloc, parts.path.strip("/")


class S3Cache:
    def __init__(
        self,
        uri: str,
        *,
        connections: int = 8,
        client: Any = None,
        region: str | None = None,
        multipart_chunk: int = 64 * MIB,
        rate: RatePolicy | None = None,
        bounds: CacheBounds | None = None,
    ) -> None:
        self.uri = uri
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.connections = connections
        self.multipart_chunk = multipart_chunk
        self.bounds = bounds or CacheBounds()
        self.rate = rate or self.bounds.rate()
        self.retry = self.bounds.retry()
        # Reads (the head, the ranges) on the cache's tight bounds; the write-back, after a verified download, on
        # botocore's usual ones (a 64 MiB part's answer comes once S3 has it all).
        # One try per call (botocore's retries would multiply the bounds): the head's tries are lookup()'s, the
        # ranges' the fetcher's.
        self.client = client or self._client(region, self.bounds.connect_s, self.bounds.read_s, 1)
        self.upload_client = client or self._client(region, 10, 60, 3)

    def _client(self, region: str | None, connect_s: float, read_s: float, attempts: int) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            # botocore reads AWS_DEFAULT_REGION, not AWS_REGION (what the boot script and the pod set); without
            # either it asks the instance metadata, which a pod cannot reach
            region_name=region or os.environ.get("AWS_REGION") or None,
            config=Config(
                max_pool_connections=self.connections * 2,
                retries={"mode": "standard", "max_attempts": attempts},
                connect_timeout=connect_s,
                read_timeout=read_s,
            ),
        )

    @staticmethod
    def check_uri(uri: str) -> None:
        parse_s3_uri(uri)

    def key(self, repo: str, revision: str, file: str) -> str:
        return "/".join(p for p in (self.prefix, repo, revision, file) if p)

    def lookup(self, repo: str, revision: str, file: str) -> CachedObject | None:
        """The cached object, or None when it is absent or the cache cannot be read (then ModelScope serves)."""
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.key(repo, revision, file)
        try:
            head = self._head(key)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 or e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                log.info("S3 cache miss: s3://%s/%s", self.bucket, key)
            else:
                log.warning("S3 cache s3://%s/%s unreadable (%s); falling back to ModelScope", self.bucket, key, e)
            return None
        except BotoCoreError as e:
            log.warning("S3 cache unreachable (%s); falling back to ModelScope", e)
            return None
        meta = {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}
        return CachedObject(
            bucket=self.bucket,
            key=key,
            size=int(head["ContentLength"]),
            sha256=(meta.get("sha256") or None),
            etag=head["ETag"],
        )

    def _head(self, key: str) -> dict[str, Any]:
        """HeadObject, tried `lookup_attempts` times when the network fails (an answer, even 404, is final)."""
        from botocore.exceptions import BotoCoreError

        for attempt in range(1, self.bounds.lookup_attempts + 1):
            try:
                return self.client.head_object(Bucket=self.bucket, Key=key)
            except BotoCoreError:
                if attempt == self.bounds.lookup_attempts:
                    raise
        raise AssertionError("unreachable")

    def source(self, obj: CachedObject) -> S3RangeSource:
        return S3RangeSource(self.client, obj, self.rate)

    def upload(self, path: Path, *, repo: str, revision: str, file: str, sha256: str) -> str:
        """Multipart upload of a verified file; returns its s3:// URI."""
        from boto3.s3.transfer import TransferConfig

        key = self.key(repo, revision, file)
        size = path.stat().st_size
        chunk = max(self.multipart_chunk, -(-size // 9000))  # S3 allows 10,000 parts
        config = TransferConfig(
            multipart_threshold=self.multipart_chunk,
            multipart_chunksize=chunk,
            max_concurrency=self.connections,
            use_threads=True,
        )
        extra = {
            "Metadata": {
                "sha256": sha256,
                "modelscope-repo": repo,
                "modelscope-revision": revision,
                "modelscope-file": file,
            },
            "ContentType": "application/octet-stream",
        }
        self.upload_client.upload_file(str(path), self.bucket, key, ExtraArgs=extra, Config=config)
        return f"s3://{self.bucket}/{key}"


class S3RangeSource:
    """Byte ranges of one cached object; If-Match pins the version we looked up."""

    name = "s3"

    def __init__(self, client: Any, obj: CachedObject, rate: RatePolicy | None = None) -> None:
        self.client = client
        self.obj = obj
        self.rate = rate or RatePolicy()

    def stream(self, start: int, end: int) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        try:
            resp = self.client.get_object(
                Bucket=self.obj.bucket, Key=self.obj.key, Range=f"bytes={start}-{end - 1}", IfMatch=self.obj.etag
            )
        except ClientError as e:
            raise _classify(e, self.obj) from e
        except Exception as e:  # noqa: BLE001 - botocore's, urllib3's or the socket's: the network, retried
            raise TransientError(f"s3://{self.obj.bucket}: {type(e).__name__}: {e}") from e
        body = resp["Body"]
        # read1 returns what has arrived; StreamingBody.read(n) would wait for all n bytes of a trickle.
        raw = getattr(body, "_raw_stream", None)
        read = raw.read1 if hasattr(raw, "read1") else body.read
        watch = self.rate.watch(f"s3://{self.obj.bucket}")
        try:
            while True:
                try:
                    chunk = read(CHUNK)
                except Exception as e:  # noqa: BLE001 - urllib3's ProtocolError, ReadTimeoutError: not OSError, not botocore's
                    raise TransientError(f"s3://{self.obj.bucket}: {type(e).__name__}: {e}") from e
                if not chunk:
                    return
                watch.add(len(chunk))
                yield chunk
        finally:
            body.close()


def _classify(e: Any, obj: CachedObject) -> Exception:
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    code = e.response.get("Error", {}).get("Code", "")
    where = f"s3://{obj.bucket}/{obj.key}"
    if status >= 500 or code in ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"):
        return TransientError(f"S3 {code or status} reading {where}")
    if status == 404:
        return NotFoundError(f"{where} disappeared during the download")
    if status == 412:
        return FetchError(f"{where} was replaced during the download (ETag changed)")
    return FetchError(f"S3 refused {where}: {code or status}")
