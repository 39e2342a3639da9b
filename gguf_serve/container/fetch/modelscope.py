"""ModelScope's model hub over HTTP: the file listing (size, sha256) and ranged file downloads.

The URLs are the ones the official SDK (modelscope 1.40) uses:
  GET {endpoint}/api/v1/models/<owner>/<repo>/repo/files?Revision=<rev>&Recursive=True
  GET {endpoint}/api/v1/models/<owner>/<repo>/repo?Revision=<rev>&FilePath=<file>   (302 to storage; Range honoured)
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error

from gguf_serve.container.fetch.deadline import with_header_deadline
from gguf_serve.container.fetch.errors import AuthError, FetchError, NotFoundError, SizeMismatch, TransientError
from gguf_serve.container.fetch.pace import RatePolicy
from gguf_serve.container.fetch.retry import RetryPolicy
from gguf_serve.container.names import PRODUCT

log = logging.getLogger("gguf-serve-fetch")

DEFAULT_ENDPOINT = "https://www.modelscope.cn"
TOKEN_ENV = "MODELSCOPE_API_TOKEN"  # noqa: S105 - the name of the official SDK's variable, not a secret
CHUNK = 1024 * 1024
LISTING_MAX_BYTES = 16 * 1024 * 1024  # decoded; a repository listing is kilobytes: more is a broken or hostile server
LISTING_DEADLINE_S = 120.0  # a whole listing read, whatever its pace (its minimum rate bounds each window only)
# One content coding at most, decoded here with a bound (urllib3 < 2.6 decoded a chained `gzip, gzip, gzip`
# without one: CVE-2025-66418 and CVE-2025-66471).
DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
USER_AGENT = f"{PRODUCT}-fetch/1 ({PRODUCT})"  # model-neutral: the tool serves any GGUF
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")

# urllib3 logs every redirect at INFO with the full Location: ModelScope's are signed storage URLs.
logging.getLogger("urllib3.poolmanager").setLevel(logging.WARNING)


def resolve_endpoint(explicit: str | None = None) -> str:
    """An explicit endpoint, else MODELSCOPE_ENDPOINT, else the public China site."""
    endpoint = (explicit or os.environ.get("MODELSCOPE_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"ModelScope endpoint must look like https://host[:port], got {endpoint!r}")
    return endpoint


@dataclass(frozen=True)
class ListedFile:
    path: str
    size: int
    sha256: str | None
    commit: str | None = None  # the listing's CommitId for this file (a 40-hex commit), when it gives one


class ModelScope:
    """A small client for the two calls a download needs. Thread-safe (one urllib3 pool)."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        connections: int = 8,
        connect_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        rate: RatePolicy | None = None,
        deadline_s: float | None = None,
    ) -> None:
        """deadline_s: every read of this client ends within this many seconds from now (None: no deadline)."""
        self.endpoint = resolve_endpoint(endpoint)
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.host = urlsplit(self.endpoint).netloc
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.retry = retry or RetryPolicy()
        self.rate = rate or RatePolicy()
        self.timeout = urllib3.Timeout(connect=connect_timeout_s, read=self.rate.idle_s)
        # Redirects are followed (the hub answers 302 to object storage); urllib3 drops Authorization and
        # Cookie when the redirect leaves the hub's host. Retries are ours, with backoff and jitter.
        self.pool = with_header_deadline(
            urllib3.PoolManager(
                num_pools=8,
                maxsize=connections + 2,
                retries=urllib3.Retry(total=10, connect=0, read=0, status=0, other=0, redirect=10),
                timeout=self.timeout,
                headers={"User-Agent": USER_AGENT},
            ),
            self.rate.headers_s,
        )

    def headers(self) -> dict[str, str]:
        if not self.token:
            return {}
        return {"Authorization": f"Bearer {self.token}", "Cookie": f"m_session_id={self.token}"}

    # --- listing -------------------------------------------------------------------------------------------------
    def list_files(self, repo: str, revision: str) -> dict[str, ListedFile]:
        url = (
            f"{self.endpoint}/api/v1/models/{_repo_path(repo)}/repo/files"
            f"?Revision={quote(revision, safe='')}&Recursive=True"
        )
        failures = 0
        while True:
            try:
                self.check_deadline(f"the file list of {repo}@{revision}")
                body = self._get_json(url, what=f"the file list of {repo}@{revision}")
                break
            except TransientError as e:
                failures += 1
                late = self.deadline is not None and time.monotonic() > self.deadline
                if failures > self.retry.attempts or late:
                    raise FetchError(f"ModelScope listing of {repo}@{revision} failed {failures} times: {e}") from e
                log.warning("ModelScope listing of %s: %s; retry %d/%d", repo, e, failures, self.retry.attempts)
                self.retry.wait(failures)
        return parse_listing(body, where=f"ModelScope's file list of {repo}@{revision} ({self.host})")

    def describe(self, repo: str, revision: str, file: str) -> ListedFile:
        files = self.list_files(repo, revision)
        if file not in files:
            ggufs = sorted(p for p in files if p.endswith(".gguf")) or sorted(files)
            shown = ", ".join(ggufs[:12]) + (" ..." if len(ggufs) > 12 else "")
            raise NotFoundError(
                f"{file} is not in ModelScope repo {repo} at revision {revision}; it has: {shown or 'no files'}"
            )
        return files[file]

    def _get_json(self, url: str, *, what: str) -> Any:
        try:
            r = self.pool.request(
                "GET", url, headers={**self.headers(), "Accept-Encoding": "gzip"}, timeout=self.timeout,
                preload_content=False, decode_content=False,
            )  # fmt: skip
        except (Urllib3Error, OSError) as e:
            raise TransientError(network_reason(e, self.host)) from e
        try:
            left = None if self.deadline is None else max(0.001, self.deadline - time.monotonic())
            data = _read_bounded(r, LISTING_MAX_BYTES, self.rate, self.host, what, r.headers.get("Content-Encoding"),
                                 deadline_s=min(left or LISTING_DEADLINE_S, LISTING_DEADLINE_S))  # fmt: skip
        except BaseException:
            r.close()  # mid-body: the connection cannot carry another request
            raise
        r.release_conn()
        _raise_for_status(r.status, data, what=what, endpoint=self.endpoint)
        try:
            body = json.loads(data)
        except ValueError as e:
            raise TransientError(f"ModelScope answered {what} with something that is not JSON") from e
        if isinstance(body, dict) and body.get("Success") is False:
            raise FetchError(f"ModelScope refused {what}: {body.get('Message')} (Code {body.get('Code')})")
        return body

    def check_deadline(self, what: str) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TransientError(f"{self.host}: out of time for {what} (this run's deadline passed)")

    # --- bytes ---------------------------------------------------------------------------------------------------
    def download_url(self, repo: str, revision: str, file: str) -> str:
        return (
            f"{self.endpoint}/api/v1/models/{_repo_path(repo)}/repo"
            f"?Revision={quote(revision, safe='')}&FilePath={quote(file, safe='')}"
        )

    def source(self, repo: str, revision: str, file: str, size: int) -> HttpRangeSource:
        return HttpRangeSource(self, self.download_url(repo, revision, file), size, label=f"{repo}/{file}")


class HttpRangeSource:
    """Byte ranges of one file over HTTP. The hub answers each download with a redirect to a signed storage URL;
    the first one is kept and later ranges go there directly (the hub is a round trip away from Ningxia, once per
    range otherwise), until storage refuses it (an expired signature): then the hub is asked again."""

    name = "modelscope"

    def __init__(self, client: ModelScope, url: str, size: int, *, label: str) -> None:
        self.client = client
        self.url = url
        self.size = size
        self.label = label
        self.storage_url: str | None = None  # where the hub's redirect led, once it did

    def stream(self, start: int, end: int) -> Iterator[bytes]:
        storage = self.storage_url
        credentials = {} if storage else self.client.headers()  # the hub's token never goes to storage
        headers = {**credentials, "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        try:
            r = self.client.pool.request(
                "GET", storage or self.url, headers=headers, preload_content=False, decode_content=False,
                timeout=self.client.timeout,
            )  # fmt: skip
        except (Urllib3Error, OSError) as e:
            raise TransientError(network_reason(e, self.client.host)) from e
        complete = False
        got = r.geturl() or ""  # the redirect's target; without a redirect urllib3 may give the path alone
        final = got if urlsplit(got).netloc else storage or self.url
        host = urlsplit(final).netloc or self.client.host  # storage, after the hub's redirect
        try:
            if storage and r.status >= 400 and r.status not in (416, 429) and r.status < 500:
                self.storage_url = None  # expired or revoked: the next attempt asks the hub for a new one
                raise TransientError(f"{host} refused the signed storage URL (HTTP {r.status}); asking the hub again")
            if r.status >= 300:
                _raise_for_status(r.status, r.read(65536), what=self.label, endpoint=self.client.endpoint)
            if not storage and urlsplit(final).netloc != urlsplit(self.url).netloc:
                self.storage_url = final
            _check_range(r.status, r.headers.get("Content-Range"), start, end, self.size, self.label)
            watch = self.client.rate.watch(host)
            while True:
                try:
                    chunk = r.read1(CHUNK)  # what has arrived: read(n) would wait for all n bytes of a trickle
                except (Urllib3Error, OSError) as e:
                    raise TransientError(f"{host}: {type(e).__name__}: {e}") from e
                if not chunk:
                    complete = True
                    return
                watch.add(len(chunk))
                self.client.check_deadline(self.label)
                yield chunk
        finally:
            if complete:
                r.release_conn()  # keep-alive: the next range reuses the connection
            else:
                r.close()


def network_reason(e: BaseException, host: str) -> str:
    """One readable line for a connection-level failure: host and cause, without urllib3's object reprs."""
    reason = getattr(e, "reason", None) or e
    text = re.sub(r"^<[^>]* object at 0x[0-9a-f]+>: ", "", str(reason))
    text = re.sub(r"^HTTP(S)?ConnectionPool\(host='[^']*', port=\d+\): ", "", text)
    return f"{host}: {text}"


def parse_listing(body: Any, *, where: str) -> dict[str, ListedFile]:
    """The blobs of a ModelScope file list, by path. Anything malformed is a FetchError naming the entry."""
    data = body.get("Data", body) if isinstance(body, dict) else body
    files = data.get("Files", []) if isinstance(data, dict) else data if isinstance(data, list) else None
    if not isinstance(files, list):
        raise FetchError(f"{where} is not a file list")
    out: dict[str, ListedFile] = {}
    for i, f in enumerate(files):
        if not isinstance(f, dict) or (f.get("Type") or "blob") != "blob":
            continue
        path, size, sha = f.get("Path"), f.get("Size"), f.get("Sha256") or None
        if isinstance(size, str) and size.isascii() and size.isdigit() and len(size) < 20:
            size = int(size)
        if not isinstance(path, str) or not path:
            raise FetchError(f"{where}: entry {i} has no Path")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise FetchError(f"{where}: {path!r} has no valid Size ({size!r})")
        if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            raise FetchError(f"{where}: {path!r} has a malformed Sha256 ({str(sha)[:80]!r})")
        commit = f.get("CommitId")
        commit = commit.lower() if isinstance(commit, str) and _COMMIT.fullmatch(commit) else None
        out[path] = ListedFile(path=path, size=size, sha256=sha.lower() if sha else None, commit=commit)
    return out


def _read_bounded(
    r: Any, limit: int, rate: RatePolicy, host: str, what: str, encoding: str | None = None, deadline_s: float = 0
) -> bytes:
    """A whole (small) body, decoded here: refused past `limit` bytes (sent or decoded), under the minimum rate,
    past `deadline_s` (LISTING_DEADLINE_S by default) in all, or with more than one content coding."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip().lower() not in ("", "identity")]
    if len(codings) > 1 or (codings and codings[0] not in DECODERS):
        raise FetchError(f"{host} answered {what} with Content-Encoding {encoding!r}; a hub sends one coding at most")
    decoder = zlib.decompressobj(DECODERS[codings[0]]) if codings else None
    deadline_s = deadline_s or LISTING_DEADLINE_S
    watch, end = rate.watch(host), time.monotonic() + deadline_s
    parts: list[bytes] = []
    sent = total = 0
    while True:
        try:
            raw = r.read1(CHUNK)
        except (Urllib3Error, OSError) as e:
            raise TransientError(f"{host}: {type(e).__name__}: {e}") from e
        if time.monotonic() > end:
            raise TransientError(f"{host} took more than {deadline_s:.0f} s to send {what}")
        watch.add(len(raw))
        sent += len(raw)
        total += _inflate(decoder, raw, parts, limit - total, host, what) if decoder else len(raw)
        if decoder is None:
            parts.append(raw)
        if total > limit or sent > limit:
            raise FetchError(f"{host} sent more than {limit // (1024 * 1024)} MiB for {what}; not a ModelScope answer")
        if not raw:
            return b"".join(parts)


def _inflate(decoder: Any, data: bytes, out: list[bytes], room: int, host: str, what: str) -> int:
    """Decode `data` into `out` a MiB at a time, never past room + 1 bytes whatever the ratio (a 275-byte body may
    claim gigabytes); the bytes added."""
    added = 0
    try:
        while added <= room:
            want = min(room + 1 - added, CHUNK)  # never 0: zlib reads a max_length of 0 as "no limit"
            piece = decoder.decompress(data, want)
            out.append(piece)
            added += len(piece)
            data = decoder.unconsumed_tail
            if not data and len(piece) < want:
                break
    except zlib.error as e:
        raise FetchError(f"{host} sent {what} with a broken content coding ({e})") from None
    return added


def _check_range(status: int, content_range: str | None, start: int, end: int, size: int, label: str) -> None:
    if status == 200 and start == 0 and end == size:
        return
    if status != 206:
        raise FetchError(f"{label}: asked for bytes {start}-{end - 1}, got HTTP {status} (ranges not honoured)")
    expected = f"bytes {start}-{end - 1}/{size}"
    if content_range != expected:
        raise SizeMismatch(f"{label}: Content-Range {content_range!r} but expected {expected!r}; the file changed?")


def _raise_for_status(status: int, body: bytes, *, what: str, endpoint: str) -> None:
    if status < 300:
        return
    message = _message(body)
    if status == 429 or status >= 500:
        raise TransientError(f"HTTP {status} for {what}" + (f": {message}" if message else ""))
    if status == 404:
        raise NotFoundError(f"ModelScope ({endpoint}) has no {what} (HTTP 404{': ' + message if message else ''})")
    if status in (401, 403):
        raise AuthError(
            f"ModelScope ({endpoint}) refused {what} (HTTP {status}{': ' + message if message else ''}); "
            f"the repo may be private or gated: set {TOKEN_ENV} to a token with access"
        )
    if status == 416:
        raise SizeMismatch(f"{what}: HTTP 416, the file is smaller than listed; it changed upstream?")
    raise FetchError(f"ModelScope ({endpoint}) answered HTTP {status} for {what}: {message or 'no message'}")


def _message(body: bytes) -> str:
    try:
        d = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", errors="replace").strip()
    if isinstance(d, dict):
        return str(d.get("Message") or d.get("message") or "")
    return ""


def _repo_path(repo: str) -> str:
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise FetchError(f"ModelScope repo must be 'owner/name', got {repo!r}")
    return "/".join(quote(p, safe="") for p in repo.split("/"))
