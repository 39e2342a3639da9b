"""An S3 stand-in for model-sized objects: HEAD and ranged GET of files on disk, at a capped rate, as WSGI.

moto keeps every object in memory (or a spooled temporary file) and copies it per request; a 16.8 GB model is
served here from a file instead (a sparse one costs no disk), with what the fetcher relies on from S3
(`gguf_serve/container/fetch/s3cache.py`): the object's size, `ETag` and `x-amz-meta-*` on HEAD; `Range` answered
206 with `Content-Range`; `If-Match` answered 412 `PreconditionFailed` when the ETag differs (the object was
replaced); 416 `InvalidRange`. Both addressing styles (path and virtual-hosted) are understood.

Two rates, as an instance sees them: `connection_bps` caps each response (one S3 GET stream) and `link_bps` caps
all of them together (the instance's network). Anything that is not a GET or HEAD of a registered object goes to
`app` (moto in the rehearsal), or answers 404 NoSuchKey without one.

    store = ObjectFiles(link_bps=400e6, connection_bps=40e6)
    store.put("bucket", "models/a/b/master/x.gguf", path, {"sha256": digest})
    server = serve(store)      # threaded, on 127.0.0.1, bodies by sendfile; server.url
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

CHUNK = 1024 * 1024
# S3's copy is not in the instance's memory: the pages this machine reads for it must leave its page cache, or a
# real-size boot's 16.8 GB of them evicts the instance's copy of the same bytes. A page sendfile handed to a socket
# is still the socket's until the peer has read it, and POSIX_FADV_DONTNEED skips it then (measured: dropping each
# chunk as sent left up to 10.9 GB of a 16.8 GB source cached). So a body drops what it sent DROP_LAG bytes ago,
# more than a socket's send buffer holds, and a second after it ends the whole file's unreferenced pages once more
# (`_drop_late`): its tail, and what readahead read past its range, into a range another body had already sent and
# dropped (measured: 1-2 MiB of a 9 MiB object left so in one run of five on a loaded machine). A body copied
# through Python drops as it goes.
DROP_LAG = 16 * CHUNK
DROP_LATE_S = 1.0
_late: list[tuple[float, Path]] = []  # (when, file): files whose unreferenced pages go then
_late_lock = threading.Lock()
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Pace:
    """A shared virtual clock: each chunk is sent no earlier than the rate allows after the chunks before it. A
    sender that wakes late may catch up by `burst_s` (a link's queue does the same): on a busy machine the
    stand-in's own late wake-ups would otherwise lower the rate it serves below the one it claims."""

    def __init__(self, bps: float, burst_s: float = 0.1) -> None:
        self.bps = bps
        self.burst_s = burst_s
        self._next: float | None = None  # the first chunk starts the clock: no allowance before anything was sent
        self._lock = threading.Lock()

    def wait(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = now if self._next is None else max(now - self.burst_s, self._next)
            self._next = start + n / self.bps
        if start > now:
            time.sleep(start - now)


@dataclass(frozen=True)
class StoredObject:
    path: Path
    size: int
    etag: str
    metadata: dict[str, str]
    modified: float


@dataclass
class Counters:
    gets: int = 0
    heads: int = 0
    refused: int = 0  # 412 and 416
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class ObjectFiles:
    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        link_bps: float | None = None,
        connection_bps: float | None = None,
    ) -> None:
        self.app = app
        self.link = Pace(link_bps) if link_bps else None
        self.connection_bps = connection_bps
        self.objects: dict[tuple[str, str], StoredObject] = {}
        self.counters = Counters()

    def limit(self, *, link_bps: float | None, connection_bps: float | None) -> None:
        self.link = Pace(link_bps) if link_bps else None
        self.connection_bps = connection_bps

    def put(self, bucket: str, key: str, path: Path, metadata: dict[str, str] | None = None) -> StoredObject:
        st = path.stat()
        etag = f'"{st.st_size:x}{st.st_mtime_ns:x}-1"'  # any quoted token; the fetcher only echoes it in If-Match
        obj = StoredObject(path, st.st_size, etag, dict(metadata or {}), st.st_mtime)
        self.objects[(bucket, key)] = obj
        return obj

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        method = environ["REQUEST_METHOD"]
        found = self._find(environ) if method in ("GET", "HEAD") else None
        if found is None:
            if self.app is not None:
                return self.app(environ, start_response)
            return _error(start_response, "404 Not Found", "NoSuchKey", "The specified key does not exist.")
        obj = found
        if_match = environ.get("HTTP_IF_MATCH")
        if if_match is not None and if_match.strip() != obj.etag:
            self._count(refused=1)
            return _error(start_response, "412 Precondition Failed", "PreconditionFailed", "If-Match failed")
        start, end, status = 0, obj.size - 1, "200 OK"
        rng = environ.get("HTTP_RANGE")
        if rng:
            m = _RANGE.match(rng.strip())
            if not m or int(m[1]) >= obj.size or (m[2] and int(m[2]) < int(m[1])):
                self._count(refused=1)
                return _error(start_response, "416 Requested Range Not Satisfiable", "InvalidRange", rng)
            start, end, status = (
                int(m[1]),
                min(int(m[2]), obj.size - 1) if m[2] else obj.size - 1,
                "206 Partial Content",
            )
        headers = [
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(end - start + 1)),
            ("ETag", obj.etag),
            ("Last-Modified", formatdate(obj.modified, usegmt=True)),
            ("Accept-Ranges", "bytes"),
            *((f"x-amz-meta-{k}", v) for k, v in obj.metadata.items()),
        ]
        if status.startswith("206"):
            headers.append(("Content-Range", f"bytes {start}-{end}/{obj.size}"))
        start_response(status, headers)
        if method == "HEAD":
            self._count(heads=1)
            return []
        self._count(gets=1)
        # Under werkzeug (the rehearsal's AWS stand-in) the body goes out with sendfile on a plain socket too.
        sock = environ.get("werkzeug.socket")
        plain = isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket) and sock.gettimeout() is None
        return self._body(obj, start, end + 1, sock if plain else None)

    def _find(self, environ: dict[str, Any]) -> StoredObject | None:
        path = unquote(environ.get("PATH_INFO", ""))
        host = environ.get("HTTP_HOST", "").split(":")[0]
        bucket, _, key = path.lstrip("/").partition("/")
        found = self.objects.get((bucket, key))
        if found is None and "." in host:  # virtual-hosted style: bucket.endpoint/key
            found = self.objects.get((host.split(".", 1)[0], path.lstrip("/")))
        return found

    def _body(self, obj: StoredObject, start: int, end: int, sock: socket.socket | None) -> FileBody:
        paces = [p for p in (Pace(self.connection_bps) if self.connection_bps else None, self.link) if p is not None]
        return FileBody(obj.path, start, end, paces, self._count, sock)

    def _count(self, **added: int) -> None:
        with self.counters.lock:
            for name, n in added.items():
                setattr(self.counters, name, getattr(self.counters, name) + n)


class FileBody:
    """Bytes [start, end) of a file at the paced rate: iterated by any WSGI server, or sent with sendfile by
    `serve` (no copy through Python: the stand-in's own CPU stays out of what a benchmark measures)."""

    def __init__(
        self, path: Path, start: int, end: int, paces: list[Pace], count: Callable[..., None],
        sock: socket.socket | None = None,
    ) -> None:  # fmt: skip
        """sock: the WSGI server's own socket, when the body may write to it (plain, blocking)."""
        self.path, self.start, self.end, self.paces, self.count = path, start, end, paces, count
        self.socket = sock

    def __iter__(self) -> Iterator[bytes]:
        if self.socket is not None:
            yield b""  # werkzeug sends the status line and headers on the first write, even an empty one
            self.sendfile(self.socket)
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            pos = self.start
            while pos < self.end:
                n = self._pace(min(CHUNK, self.end - pos))
                block = os.pread(fd, n, pos)
                if not block:
                    return
                os.posix_fadvise(fd, pos, len(block), os.POSIX_FADV_DONTNEED)  # copied: no socket holds them
                pos += len(block)
                self.count(bytes_sent=len(block))
                yield block
        finally:
            os.close(fd)
            self._drop_later()

    def sendfile(self, sock: Any) -> None:
        with self.path.open("rb") as f:
            pos = dropped = self.start
            try:
                while pos < self.end:
                    n = self._pace(min(CHUNK, self.end - pos))
                    sent = os.sendfile(sock.fileno(), f.fileno(), pos, n)
                    if sent <= 0:
                        raise OSError("sendfile sent nothing")
                    pos += sent
                    self.count(bytes_sent=sent)
                    if pos - DROP_LAG > dropped:
                        os.posix_fadvise(f.fileno(), dropped, pos - DROP_LAG - dropped, os.POSIX_FADV_DONTNEED)
                        dropped = pos - DROP_LAG
                    _drop_late()
            finally:
                self._drop_later()

    def _drop_later(self) -> None:
        with _late_lock:
            _late.append((time.monotonic() + DROP_LATE_S, self.path))

    def _pace(self, n: int) -> int:
        for pace in self.paces:
            pace.wait(n)
        return n


def _drop_late(now: float | None = None) -> None:
    """Drop the page cache of the files whose bodies ended a second ago (any body's next chunk calls this)."""
    now = time.monotonic() if now is None else now
    with _late_lock:
        due = [x for x in _late if x[0] <= now]
        _late[:] = [x for x in _late if x[0] > now]
    for _, path in due:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the whole file; pages a socket holds are skipped
        finally:
            os.close(fd)


def _error(start_response: Callable[..., Any], status: str, code: str, message: str) -> list[bytes]:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>stand-in</RequestId></Error>").encode()  # fmt: skip
    start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive in front of one ObjectFiles: a minimal WSGI call, file bodies sent with sendfile."""

    protocol_version = "HTTP/1.1"
    store: ObjectFiles

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path, _, query = self.path.partition("?")
        environ = {"REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query}
        environ |= {"HTTP_" + k.upper().replace("-", "_"): v for k, v in self.headers.items()}
        answer: list[Any] = []
        body = self.store(environ, lambda status, headers: answer.extend([status, headers]))
        status, headers = answer
        self.send_response(int(status.split()[0]), status.split(" ", 1)[1])
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        try:
            if isinstance(body, FileBody):
                body.sendfile(self.connection)
            else:
                for block in body:
                    self.wfile.write(block)
        except OSError:
            self.close_connection = True

    do_HEAD = do_GET


class Served:
    """An ObjectFiles on 127.0.0.1 in a thread, one thread per connection."""

    def __init__(self, store: ObjectFiles, port: int = 0) -> None:
        handler = type("Handler", (_Handler,), {"store": store})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="objectstore", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def serve(store: ObjectFiles, port: int = 0) -> Served:
    return Served(store, port)
