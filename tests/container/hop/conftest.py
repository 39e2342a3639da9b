"""A scripted stand-in for llama-server over real HTTP, and a hop in front of it, both on loopback threads."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gguf_serve.container.hop.proxy import ProxyServer

from .events import TIMINGS, chat_chunk, sse  # noqa: F401 - the hop tests import them from here
from .scripted import ScriptedUpstream

POLL_S = 0.05  # socketserver's serve_forever polls for shutdown: its default 0.5 s was every test's teardown

KEY = "test-key-123"
TEST_GATE = "the test itself (a keyless hop on loopback)"  # ProxyServer needs a key source or a named gate


def _read_chunked(rfile) -> bytes:
    out = b""
    while size := int(rfile.readline().split(b";")[0], 16):
        out += rfile.read(size)
        rfile.readline()
    rfile.readline()
    return out


def _closed_within(conn: socket.socket, seconds: float) -> bool:
    """True when the peer closes the connection within `seconds` (readable with nothing to read)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([conn], [], [], left)[0]:
            try:
                return conn.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True
    return False


class Upstream(ThreadingHTTPServer):
    """Answers like llama-server: 401 without the key; a stream whose pieces are paced by `gate` events."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.gate = threading.Event()  # the stream's second half waits for this
        self.pause_s = 0.0
        self.keyless_pause_s = 0.0  # llama-server busy: its 401 comes this late
        self.tail_pause_s = 0.0  # after `data: [DONE]`, before the chunked body's end
        self.stream_closed = threading.Event()
        self.held = threading.Event()
        self.hold_closed = threading.Event()
        super().__init__(("127.0.0.1", 0), UpstreamHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Upstream

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        target = self.requestline.split()[1]  # http.server turns a leading // into / in self.path
        self.server.seen.append({"method": "GET", "path": self.path, "target": target, "headers": dict(self.headers)})
        if self.path == "/metrics":
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                return self._json(401, {"error": {"message": "Invalid API Key"}})
            body = b"# HELP llamacpp:requests_processing x\n# TYPE llamacpp:requests_processing gauge\n"
            body += b"llamacpp:requests_processing 0\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Process-Start-Time-Unix", "1700000000")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        return self._json(200, {"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802
        lengths = self.headers.get_all("Content-Length") or []
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            # llama-server checks the key before it reads the body, answers 401 and closes
            self.server.seen.append({"method": "POST", "path": self.path, "headers": dict(self.headers)})
            time.sleep(self.server.keyless_pause_s)
            self.close_connection = True
            return self._json(401, {"error": {"message": "Invalid API Key"}})
        raw = self.rfile.read(int(lengths[0])) if lengths else _read_chunked(self.rfile)
        body = json.loads(raw)
        self.server.seen.append(
            {"method": "POST", "path": self.path, "headers": dict(self.headers), "body": body, "lengths": lengths}
        )
        if body.get("hold"):  # a non-streamed answer that waits for the hop to close the connection
            self.server.held.set()
            if _closed_within(self.connection, 10):
                self.server.hold_closed.set()
            self.close_connection = True
            return None
        if not body.get("stream"):
            time.sleep(self.server.pause_s)
            return self._json(200, {"choices": [{"message": {"content": "abcd"}}], "timings": TIMINGS})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        pieces = [sse(chat_chunk(None, role="assistant")), sse(chat_chunk("a")), sse(chat_chunk("b"))]
        later = [sse(chat_chunk("c")), sse(chat_chunk("d"))]
        end = [sse({**chat_chunk(None), "timings": TIMINGS}), sse("[DONE]")]
        try:
            time.sleep(self.server.pause_s)
            for p in pieces:
                self._chunk(p)
            if body.get("crash"):  # llama-server dies mid-stream: the connection ends without the last chunk
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return None
            self.server.gate.wait(10)
            for p in [*later, *end]:
                self._chunk(p)
                time.sleep(0.02)
            self.wfile.flush()
            time.sleep(self.server.tail_pause_s)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.server.stream_closed.set()
            self.close_connection = True
        return None

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
    yield server
    server.gate.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def hop(upstream: Upstream) -> Iterator[ProxyServer]:
    server = ProxyServer(("127.0.0.1", 0), upstream.url, gate=TEST_GATE)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    assert server.wait_started(10), "the hop did not start serving"  # a test may read its loop (test_loop.py)
    yield server
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def _hops(default_url: str) -> Iterator[Callable[..., ProxyServer]]:
    """make(url=None, **ProxyServer settings): hops in front of `default_url` (or url), all stopped at the end."""
    started: list[ProxyServer] = []

    def make(url: str | None = None, **kwargs) -> ProxyServer:
        server = ProxyServer(("127.0.0.1", 0), url or default_url, **{"gate": TEST_GATE, **kwargs})
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        # Serving before the test goes on: connections would wait in the backlog anyway, but a test that reads the
        # hop's loop or tables raced its start (seen once under a parallel run: the loop not made yet).
        assert server.wait_started(10), "the hop did not start serving"
        return server

    try:
        yield make
    finally:
        for server in started:
            server.shutdown()
            server.server_close()


@pytest.fixture
def make_hop(upstream: Upstream) -> Iterator:
    """make_hop(limits=..., admission=..., upstream=url): a hop with other settings, stopped after the test."""
    with _hops(upstream.url) as make:
        yield make


@pytest.fixture
def scripted():
    """A ScriptedUpstream (scripted.py) with an empty script: each test sets `script`."""
    server = ScriptedUpstream([])
    yield server
    server.close()


@pytest.fixture
def make_pooled_hop(scripted, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ProxyServer]]:
    """make_pooled_hop(**ProxyServer settings): a hop in front of `scripted`, stopped after the test."""
    from gguf_serve.container.hop import upstream as upstream_pool

    monkeypatch.setattr(upstream_pool, "UPSTREAM_IDLE_S", 60.0)  # only the hop's own decisions close a connection
    with _hops(scripted.url) as make:
        yield make


def hop_url(server: ProxyServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"
