"""A local server that answers like ModelScope's model hub, for tests, benchmarks and the embedded default.

Endpoints (the ones the modelscope 1.40 SDK and modelfetch call):
  GET /api/v1/models/<owner>/<repo>/repo/files?Revision=..&Recursive=..   file listing (Path, Type, Size, Sha256)
  GET|HEAD /api/v1/models/<owner>/<repo>/repo?Revision=..&FilePath=..     file bytes, HTTP Range
  GET|HEAD /models/<owner>/<repo>/resolve/<revision>/<file>               file bytes, HTTP Range
  GET /api/v1/models/<owner>/<repo>/revisions                            branches and tags
  GET /api/v1/models/<owner>/<repo>                                      repository metadata
  GET /api/v1/repos/internalAccelerationInfo                             no in-cloud acceleration
Every JSON answer uses ModelScope's envelope: {"Code", "Data", "Message", "RequestId", "Success"}.

A repository is a directory `<root>/<owner>/<repo>/`, or files registered with `LocalScope.add_file`.
`Faults` injects what real networks do: a per-connection bandwidth cap, 5xx answers, connection resets
in the middle of a body, and corrupted bytes.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from gguf_serve.container.digest import sha256_file

CHUNK = 256 * 1024
_FILES = re.compile(r"^/api/v1/models/([^/]+)/([^/]+)/repo/files$")
_REPO_FILE = re.compile(r"^/api/v1/models/([^/]+)/([^/]+)/repo$")
_RESOLVE = re.compile(r"^/models/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
_REVISIONS = re.compile(r"^/api/v1/models/([^/]+)/([^/]+)/revisions$")
_MODEL = re.compile(r"^/api/v1/models/([^/]+)/([^/]+)$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")

# Business codes the real hub answers with (HTTP status in the second column).
NOT_FOUND = 10010205001
UNAUTHORIZED = 10010103009
SERVER_BUSY = 10010000500


@dataclass
class Faults:
    """What goes wrong, and how often. Change fields at any time; the server reads them per request."""

    bandwidth_bps: float | None = None  # per connection (per response body), bytes per second
    fail_every: int = 0  # every Nth download request answers 503 (0: never)
    reset_every: int = 0  # every Nth download request is reset mid-body (0: never)
    reset_after_bytes: int = 64 * 1024  # how much of the body a reset request sends first
    reset_with_rst: bool = True  # True: TCP RST (unread bytes are lost); False: FIN after a short body
    corrupt_offset: int | None = None  # file offset whose byte is flipped in served bodies
    corrupt_times: int | None = 1  # how many bodies carry the flipped byte (None: every one)
    token: str | None = None  # when set, requests without this token answer 401
    redirect_to: str | None = None  # base URL: the SDK download URL answers 302 to a signed URL there, like the hub
    signed_url_uses: int | None = None  # a signed URL answers this many downloads, then 403 (expired); None: forever
    trickle_every_s: float | None = None  # hostile: file bodies go out one byte per this many seconds
    trickle_json_every_s: float | None = None  # hostile: the same for JSON answers (the listing)
    listed_sizes: dict[str, int] = field(default_factory=dict)  # hostile: path in repo -> the size the listing claims
    range_totals: dict[str, int] = field(default_factory=dict)  # hostile: path in repo -> the Content-Range total
    listing_encoded: tuple[str, bytes] | None = None  # hostile: the listing's answer is (Content-Encoding, these bytes)


@dataclass
class Stats:
    """Counters tests assert on: what was asked and how many body bytes went out."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, **entry: Any) -> None:
        with self.lock:
            self.requests.append(entry)

    def add_bytes(self, n: int) -> None:
        with self.lock:
            self.bytes_sent += n

    def downloads(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["kind"] == "download"]

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes_sent = 0


class _Reset(Exception):
    """Abort the connection with a TCP reset."""


class LocalScope:
    """An in-process ModelScope look-alike. Use as a context manager, or call start() and stop()."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: Faults | None = None,
        revisions: tuple[str, ...] | None = None,  # None: every revision name resolves to the same files
    ) -> None:
        self.root = Path(root) if root is not None else None
        self.faults = faults or Faults()
        self.stats = Stats()
        self.revisions = revisions
        self._extra: dict[tuple[str, str], Path] = {}
        self._hashes: dict[tuple[str, int, int], str] = {}
        self._lock = threading.Lock()
        self._download_count = 0
        self._corrupted = 0
        self._signature_uses: dict[str, int] = {}
        self._httpd = _Server((host, port), _handler_for(self))
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LocalScope:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="gguf-serve-hub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def __enter__(self) -> LocalScope:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- content ---------------------------------------------------------------------------------------------------
    def add_file(self, repo: str, path_in_repo: str, source: str | Path) -> None:
        """Serve `source` as `path_in_repo` of `repo` ("owner/name") without copying it."""
        self._extra[(repo, path_in_repo)] = Path(source)

    def repo_exists(self, repo: str) -> bool:
        if any(r == repo for r, _ in self._extra):
            return True
        return self._repo_dir(repo) is not None

    def _repo_dir(self, repo: str) -> Path | None:
        """`root/owner/name` when `repo` names a directory inside root (no "..", no link out of it), else None."""
        if self.root is None or not _safe_repo(repo):
            return None
        base = self.root / repo
        if not base.is_dir() or not base.resolve().is_relative_to(self.root.resolve()):
            return None
        return base

    def files(self, repo: str) -> dict[str, Path]:
        out: dict[str, Path] = {}
        base = self._repo_dir(repo)
        if base is not None:
            inside = base.resolve()
            for p in sorted(base.rglob("*")):
                rel = p.relative_to(base).as_posix()
                hidden = rel.endswith(".sha256") or any(s.startswith(".") for s in rel.split("/"))
                if p.is_file() and not hidden and p.resolve().is_relative_to(inside):
                    out[rel] = p
        for (r, rel), p in self._extra.items():
            if r == repo:
                out[rel] = p
        return out

    def sha256(self, path: Path) -> str:
        """The file's sha256, from a `<file>.sha256` next to it when present, else computed once and cached."""
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._hashes:
                return self._hashes[key]
        side = path.with_name(path.name + ".sha256")
        if side.is_file() and side.stat().st_mtime_ns >= st.st_mtime_ns:
            digest = side.read_text().split()[0]
        else:
            digest = sha256_file(path)
        with self._lock:
            self._hashes[key] = digest
        return digest

    # --- fault bookkeeping -----------------------------------------------------------------------------------------
    def _next_download(self) -> int:
        with self._lock:
            self._download_count += 1
            return self._download_count

    def _signature_spent(self, sig: str) -> bool:
        """True when the signed URL `sig` has answered its allowed downloads (counts this one otherwise)."""
        with self._lock:
            limit = self.faults.signed_url_uses
            used = self._signature_uses.get(sig, 0)
            if limit is not None and used >= limit:
                return True
            self._signature_uses[sig] = used + 1
            return False

    def _take_corruption(self) -> bool:
        with self._lock:
            limit = self.faults.corrupt_times
            if limit is not None and self._corrupted >= limit:
                return False
            self._corrupted += 1
            return True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True


def _safe_repo(repo: str) -> bool:
    parts = repo.split("/")
    return len(parts) == 2 and all(p not in ("", ".", "..") and "\\" not in p and "\x00" not in p for p in parts)


def _envelope(data: Any, *, code: int = 200, message: str = "success") -> dict[str, Any]:
    return {
        "Code": code,
        "Data": data,
        "Message": message,
        "RequestId": uuid.uuid4().hex,
        "Success": code == 200,
    }


def _handler_for(scope: LocalScope) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.scope = scope
    return Handler


def _repo(m: re.Match[str]) -> str:
    return f"{unquote(m[1])}/{unquote(m[2])}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gguf-serve-hub"
    scope: LocalScope

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    # --- plumbing --------------------------------------------------------------------------------------------------
    def _json(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        every_s = self.scope.faults.trickle_json_every_s
        if self.command != "HEAD" and every_s:
            self.wfile.flush()
            try:
                for i in range(len(raw)):
                    self.connection.sendall(raw[i : i + 1])
                    time.sleep(every_s)
            except OSError:
                self.close_connection = True  # the client gave up, as it should
        elif self.command != "HEAD":
            self.wfile.write(raw)

    def _error(self, status: int, code: int, message: str) -> None:
        self._json(status, _envelope(None, code=code, message=message))

    def _authorized(self) -> bool:
        token = self.scope.faults.token
        if token is None:
            return True
        if self.headers.get("Authorization", "") == f"Bearer {token}":
            return True
        return f"m_session_id={token}" in self.headers.get("Cookie", "")

    def _record(self, kind: str, status: int, **extra: Any) -> None:
        self.scope.stats.record(
            kind=kind,
            method=self.command,
            path=self.path,
            status=status,
            range=self.headers.get("Range"),
            host=self.headers.get("Host"),
            credentials=bool(self.headers.get("Authorization") or "m_session_id" in self.headers.get("Cookie", "")),
            **extra,
        )

    # --- routing ---------------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        path = url.path  # route on the raw path: each part is decoded after matching, so %2F and %2E%2E stay inside
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if path == "/api/v1/repos/internalAccelerationInfo":
            self._record("api", 200)
            return self._json(200, _envelope({"InternalRegionQueryAddress": ""}))
        if not self._authorized() and not q.get("sig"):  # a signed storage URL needs no token
            self._record("denied", 401)
            return self._error(401, UNAUTHORIZED, "AccessToken is invalid or expired, please login again")
        if m := _FILES.match(path):
            return self._list_files(_repo(m), q.get("Revision", "master"), q.get("Root"))
        if m := _REPO_FILE.match(path):
            if self.scope.faults.redirect_to:
                return self._redirect(_repo(m), q.get("Revision", "master"), q.get("FilePath", ""))
            return self._download(_repo(m), q.get("Revision", "master"), q.get("FilePath", ""))
        if m := _RESOLVE.match(path):
            if q.get("sig") and self.command == "GET" and self.scope._signature_spent(q["sig"]):
                self._record("expired", 403)
                return self._error(403, UNAUTHORIZED, "Request has expired")
            return self._download(_repo(m), unquote(m[3]), unquote(m[4]))
        if m := _REVISIONS.match(path):
            return self._revisions(_repo(m))
        if m := _MODEL.match(path):
            return self._model(_repo(m))
        self._record("unknown", 404)
        self._error(404, NOT_FOUND, f"no such endpoint: {path}")

    def _check_repo(self, repo: str, revision: str | None = None) -> bool:
        if not self.scope.repo_exists(repo):
            self._record("missing", 404)
            self._error(404, NOT_FOUND, f"获取模型信息失败，信息：model {repo} not found")
            return False
        if revision is not None and self.scope.revisions is not None and revision not in self.scope.revisions:
            self._record("missing", 404)
            self._error(404, NOT_FOUND, f"revision {revision} not found in {repo}")
            return False
        return True

    # --- API -------------------------------------------------------------------------------------------------------
    def _list_files(self, repo: str, revision: str, root: str | None) -> None:
        if not self._check_repo(repo, revision):
            return
        entries: list[dict[str, Any]] = []
        dirs: set[str] = set()
        prefix = (root or "").strip("/")
        for rel, p in self.scope.files(repo).items():
            if prefix and not rel.startswith(prefix + "/"):
                continue
            parts = rel.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            st = p.stat()
            entries.append(
                {
                    "CommitId": "0" * 40,
                    "CommitMessage": "upload",
                    "CommittedDate": int(st.st_mtime),
                    "CommitterName": "gguf-serve-hub",
                    "InCheck": False,
                    "IsLFS": st.st_size > 10 * 1024 * 1024,
                    "Mode": "33188",
                    "Name": parts[-1],
                    "Path": rel,
                    "Revision": revision,
                    "Sha256": self.scope.sha256(p),
                    "Size": self.scope.faults.listed_sizes.get(rel, st.st_size),
                    "Type": "blob",
                }
            )
        for d in sorted(dirs):
            if not prefix or d.startswith(prefix + "/"):
                entries.append({"Name": d.rsplit("/", 1)[-1], "Path": d, "Type": "tree", "Size": 0, "Sha256": ""})
        self._record("listing", 200)
        if self.scope.faults.listing_encoded is not None:
            encoding, raw = self.scope.faults.listing_encoded
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        self._json(200, _envelope({"Files": entries, "LatestCommitter": {"CommitterName": "gguf-serve-hub"}}))

    def _revisions(self, repo: str) -> None:
        if not self._check_repo(repo):
            return
        names = self.scope.revisions or ("master",)
        now = int(time.time())
        branches = [{"Revision": n, "CreatedAt": now, "Message": ""} for n in names if not n.startswith("v")]
        tags = [{"Revision": n, "CreatedAt": now, "Message": ""} for n in names if n.startswith("v")]
        self._record("api", 200)
        self._json(200, _envelope({"RevisionMap": {"Branches": branches, "Tags": tags}}))

    def _model(self, repo: str) -> None:
        if not self._check_repo(repo):
            return
        owner, name = repo.split("/", 1)
        self._record("api", 200)
        self._json(200, _envelope({"Path": owner, "Name": name, "Id": 1, "Private": False, "Visibility": 5}))

    # --- bytes -----------------------------------------------------------------------------------------------------
    def _redirect(self, repo: str, revision: str, file_path: str) -> None:
        if not self._check_repo(repo, revision):
            return
        base = (self.scope.faults.redirect_to or "").rstrip("/")
        location = f"{base}/models/{repo}/resolve/{quote(revision)}/{quote(file_path)}?sig={uuid.uuid4().hex}"
        self._record("redirect", 302)
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _download(self, repo: str, revision: str, file_path: str) -> None:
        if not self._check_repo(repo, revision):
            return
        source = self.scope.files(repo).get(file_path.strip("/"))
        if source is None:
            self._record("missing", 404)
            return self._error(404, NOT_FOUND, f"file {file_path} not found in {repo}@{revision}")
        faults = self.scope.faults
        n = self.scope._next_download() if self.command == "GET" else 0
        if faults.fail_every and n and n % faults.fail_every == 0:
            self._record("download", 503, injected="503")
            return self._error(503, SERVER_BUSY, "service busy, please retry")
        size = source.stat().st_size
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng:
            m = _RANGE.match(rng.strip())
            if not m or (m[1] == "" and m[2] == ""):
                start, end = 0, size - 1  # unparseable or multi-range: serve the whole file, as many servers do
            else:
                if m[1] == "":
                    start, end = max(0, size - int(m[2])), size - 1
                else:
                    start = int(m[1])
                    end = min(int(m[2]), size - 1) if m[2] else size - 1
                if start >= size or start > end:
                    self._record("download", 416)
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{self.scope.sha256(source)[:32]}"')
        self.send_header("Last-Modified", formatdate(source.stat().st_mtime, usegmt=True))
        self.send_header("Content-Disposition", f'attachment; filename="{Path(file_path).name}"')
        if status == 206:
            total = faults.range_totals.get(file_path.strip("/"), size)  # a liar agrees with its listing
            self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
        self.end_headers()
        if self.command == "HEAD":
            self._record("head", status)
            return
        reset_at = faults.reset_after_bytes if faults.reset_every and n % faults.reset_every == 0 else None
        sent = 0
        t_body = time.monotonic()
        try:
            sent = self._send_body(source, start, length, reset_at)
        except _Reset:
            self._record("download", status, injected="reset", sent=faults.reset_after_bytes)
            self._abort()
            return
        except OSError:
            self._record("download", status, injected="client-gone")
            self.close_connection = True
            return
        self._record("download", status, sent=sent, start=t_body, seconds=time.monotonic() - t_body)

    def _send_body(self, source: Path, start: int, length: int, reset_at: int | None) -> int:
        faults = self.scope.faults
        bps = faults.bandwidth_bps
        corrupt = faults.corrupt_offset
        flip = corrupt is not None and start <= corrupt < start + length and self.scope._take_corruption()
        self.wfile.flush()
        sock = self.connection
        t0 = time.monotonic()
        sent = 0
        if faults.trickle_every_s:
            return self._trickle(source, start, length, faults.trickle_every_s)
        with source.open("rb") as f:
            fd = f.fileno()
            while sent < length:
                n = min(CHUNK, length - sent)
                if reset_at is not None and sent + n > reset_at:
                    n = reset_at - sent
                    if n <= 0:
                        raise _Reset()
                off = start + sent
                if flip and corrupt is not None and off <= corrupt < off + n:
                    block = bytearray(os.pread(fd, n, off))
                    block[corrupt - off] ^= 0xFF
                    sock.sendall(block)
                    k = n
                else:
                    k = os.sendfile(sock.fileno(), fd, off, n)
                    if k == 0:
                        raise OSError("sendfile sent nothing")
                sent += k
                self.scope.stats.add_bytes(k)
                if bps:
                    delay = t0 + sent / bps - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
        if reset_at is not None:
            raise _Reset()
        return sent

    def _trickle(self, source: Path, start: int, length: int, every_s: float) -> int:
        """A hostile server: one byte at a time, never idle long enough for a read timeout."""
        with source.open("rb") as f:
            f.seek(start)
            for _ in range(length):
                self.connection.sendall(f.read(1))
                self.scope.stats.add_bytes(1)
                time.sleep(every_s)
        return length

    def _abort(self) -> None:
        """Drop the connection mid-body: RST like a middlebox, or a clean close that leaves a short body."""
        self.close_connection = True
        if not self.scope.faults.reset_with_rst:
            return
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass
