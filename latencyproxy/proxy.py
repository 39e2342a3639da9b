"""The hop: a threaded HTTP/1.1 reverse proxy that forwards every request to llama-server as it comes.

Bodies flow through in whatever pieces llama-server sends them (read1, one write per piece, TCP_NODELAY), so
an SSE stream reaches the client token by token. Headers, including Authorization, go upstream unchanged and
are never logged: llama-server checks the API key. GET /metrics answers llama-server's own /metrics (with the
caller's key, so the same key check applies) followed by the hop's histograms and the GPU gauges.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from latencyproxy.gpu import GpuReader
from latencyproxy.metrics import RequestMetrics, RequestRecord, SseTokenScanner

log = logging.getLogger("latencyproxy")

GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/completion"}
)
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers", "transfer-encoding",
     "upgrade", "host"}
)  # fmt: skip
MAX_KEPT_BODY = 8 * 1024 * 1024  # a non-streamed answer is read for its timings up to this size
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: str,
        *,
        metrics: RequestMetrics | None = None,
        gpu: GpuReader | None = None,
        upstream_timeout_s: float = 900.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.upstream_netloc = parts.netloc
        self.metrics = metrics or RequestMetrics()
        self.gpu = gpu
        self.upstream_timeout_s = upstream_timeout_s
        super().__init__(listen, Handler)

    def hop_exposition(self) -> str:
        return self.metrics.exposition() + (self.gpu.exposition() if self.gpu else "")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyServer
    server_version = "gguf-serve-hop"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802 - the base class dispatches on these names
        self._forward()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    def _forward(self) -> None:
        started = time.monotonic()
        path = urlsplit(self.path).path
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._reply(411, b'{"error":{"code":411,"message":"send a Content-Length body"}}')
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._reply(400, b'{"error":{"code":400,"message":"bad Content-Length"}}')
            return
        body = self.rfile.read(length) if length > 0 else b""
        measured = self.command == "POST" and path in GENERATION_PATHS
        record = RequestRecord(started) if measured else None
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=self.server.upstream_timeout_s
        )
        try:
            try:
                upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                upstream.putheader("Host", self.server.upstream_netloc)
                for name, value in self.headers.items():
                    if name.lower() not in HOP_BY_HOP:
                        upstream.putheader(name, value)
                upstream.endheaders(body or None)
                response = upstream.getresponse()
            except OSError as e:
                log.warning("upstream %s unreachable: %s", self.server.upstream_netloc, e)
                if record:
                    record.status = 502
                    self.server.metrics.observe(record)
                self._reply(502, b'{"error":{"code":502,"message":"llama-server is not reachable"}}')
                return
            if self.command == "GET" and path == "/metrics":
                self._metrics(response)
            else:
                self._relay(response, record)
        finally:
            upstream.close()

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _metrics(self, response: http.client.HTTPResponse) -> None:
        body = response.read()
        if response.status != 200:  # 401 without the key, 503 while loading: llama-server's answer as it is
            self._send_head(response, len(body))
            self.wfile.write(body)
            return
        body = body.rstrip(b"\n") + b"\n" + self.server.hop_exposition().encode()
        self.send_response_only(200, response.reason)
        for name, value in response.getheaders():  # Process-Start-Time-Unix: fleetmetrics sees server restarts
            if name.lower() not in HOP_BY_HOP and name.lower() not in ("content-length", "content-type"):
                self.send_header(name, value)
        self.send_header("Content-Type", response.getheader("Content-Type") or METRICS_CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_head(self, response: http.client.HTTPResponse, length: int | None) -> bool:
        """Status and upstream headers; returns whether the body goes chunked."""
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        chunked = False
        if length is not None:
            self.send_header("Content-Length", str(length))
        elif self.request_version == "HTTP/1.1":
            self.send_header("Transfer-Encoding", "chunked")
            chunked = True
        else:
            self.close_connection = True
        if response.will_close and length is None and not chunked:
            self.send_header("Connection", "close")
        self.end_headers()
        return chunked

    def _relay(self, response: http.client.HTTPResponse, record: RequestRecord | None) -> None:
        no_body = self.command == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200
        length_header = response.getheader("Content-Length")
        length = int(length_header) if length_header and length_header.isdigit() and not response.chunked else None
        chunked = self._send_head(response, 0 if no_body else length)
        scanner = kept = None
        if record is not None:
            record.status = response.status
            record.stream = (response.getheader("Content-Type") or "").startswith("text/event-stream")
            scanner = SseTokenScanner(record) if record.stream else None
            kept = bytearray() if not record.stream and response.status == 200 else None
        try:
            while not no_body:
                data = response.read1(65536)
                if not data:
                    break
                if scanner is not None:
                    scanner.feed(data, time.monotonic())
                elif kept is not None and len(kept) + len(data) <= MAX_KEPT_BODY:
                    kept += data
                self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError) as e:  # the client left; closing upstream cancels the task
            self.close_connection = True
            if record is not None:
                record.client_closed = True
            log.debug("client closed during the answer: %s", e)
        except (OSError, http.client.HTTPException) as e:  # upstream died mid-answer: end this connection too
            self.close_connection = True
            log.warning("upstream answer broke off: %s: %s", type(e).__name__, e)
        if record is None:
            return
        record.finished = time.monotonic()
        if kept is not None:
            record.timings = _timings(bytes(kept))
        self.server.metrics.observe(record)


def _timings(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    timings = doc.get("timings") if isinstance(doc, dict) else None
    return timings if isinstance(timings, dict) else None
