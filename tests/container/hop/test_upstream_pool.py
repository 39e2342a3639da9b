"""The hop keeps connections to llama-server alive between requests, and only clean ones: a scripted upstream over
raw sockets counts its accepts and answers each request as its script says (llama-server's keep-alive framing)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gguf_serve.container.hop import upstream as upstream_pool
from gguf_serve.container.hop.proxy import ProxyServer

from .conftest import KEY, TIMINGS, chat_chunk, sse

ANSWER = [sse(chat_chunk("a")), sse(chat_chunk("b")), sse({**chat_chunk(None), "timings": TIMINGS}), sse("[DONE]")]


class ScriptedUpstream:
    """HTTP/1.1 keep-alive like cpp-httplib. Each request takes the next step of `script`:
    "sse" a whole streamed answer; "json" a whole Content-Length answer; "close" a whole streamed answer with
    `Connection: close` (the connection left open: the hop must close it); "cut" the answer's head and one chunk,
    then the close; "hang" the head and one chunk, then nothing until the hop closes the connection; "drop" the
    request read and the connection closed without a byte (a kept connection closed as the request came)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.accepts = 0
        self.requests: list[bytes] = []
        self.open: list[socket.socket] = []
        self.closed_by_hop = threading.Event()  # a "close" or "hang" connection that the hop closed
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepts += 1
            self.open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as rfile:
            while head := self._head(rfile):
                length = next((int(v) for n, v in head if n == b"content-length"), 0)
                self.requests.append(rfile.read(length))
                step = self.script.pop(0) if self.script else "sse"
                if step == "drop":
                    return
                if step == "json":
                    body = json.dumps({"choices": [{"message": {"content": "ab"}}], "timings": TIMINGS}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5, "
                                 b"max=100\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
                    continue
                close = b"Connection: close\r\n" if step == "close" else b"Keep-Alive: timeout=5, max=100\r\n"
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + close
                             + b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
                for piece in ANSWER if step in ("sse", "close") else ANSWER[:1]:
                    conn.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
                if step == "cut":
                    return
                if step != "hang":
                    conn.sendall(b"0\r\n\r\n")
                if step in ("close", "hang"):
                    conn.settimeout(5)
                    if rfile.read(1) == b"":
                        self.closed_by_hop.set()
                    return

    @staticmethod
    def _head(rfile) -> list[tuple[bytes, bytes]] | None:
        if not rfile.readline():
            return None
        fields = []
        while (line := rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            fields.append((name.strip().lower(), value.strip()))
        return fields

    def close_idle(self) -> None:
        """llama-server's keep-alive timeout: every connection it holds is closed."""
        for conn in self.open:
            conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def scripted() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream([])
    yield server
    server.close()


@pytest.fixture
def pooled_hop(scripted: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProxyServer]:
    monkeypatch.setattr(upstream_pool, "UPSTREAM_IDLE_S", 60.0)  # only the hop's own decisions close a connection
    server = ProxyServer(("127.0.0.1", 0), scripted.url)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _chat(hop: ProxyServer, stream: bool = True) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=10)
    body = json.dumps({"stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"})
    response = conn.getresponse()
    try:
        return response.status, response.read()
    except http.client.IncompleteRead as e:
        return -1, e.partial
    finally:
        conn.close()


def _pooled(hop: ProxyServer, n: int) -> None:
    """Wait until the hop's loop has put `n` connections back in its pool (it does so after the client's answer)."""
    deadline = time.monotonic() + 5
    while len(hop.upstream) != n:
        assert time.monotonic() < deadline, f"{len(hop.upstream)} idle upstream connections, not {n}"
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [True, False])
def test_a_second_request_reuses_the_upstream_connection(scripted, pooled_hop, stream) -> None:
    scripted.script = ["sse" if stream else "json"] * 3
    for _ in range(3):
        status, body = _chat(pooled_hop, stream)
        assert status == 200 and (b"[DONE]" in body if stream else b'"ab"' in body)
        _pooled(pooled_hop, 1)
    assert scripted.accepts == 1 and len(scripted.requests) == 3


def test_a_cut_answer_is_not_reused(scripted, pooled_hop) -> None:
    scripted.script = ["cut", "sse"]
    status, body = _chat(pooled_hop)
    assert status == -1 and b"[DONE]" not in body  # the client sees a cut answer, not a complete one
    _pooled(pooled_hop, 0)
    assert _chat(pooled_hop)[0] == 200
    assert scripted.accepts == 2


def test_a_client_that_leaves_mid_answer_closes_the_upstream_connection(scripted, pooled_hop) -> None:
    scripted.script = ["hang", "sse"]
    client = socket.create_connection(("127.0.0.1", pooled_hop.server_address[1]), timeout=10)
    body = json.dumps({"stream": True, "messages": []}).encode()
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\n"
                   b"Content-Length: %d\r\n\r\n%b" % (KEY.encode(), len(body), body))  # fmt: skip
    seen = b""
    while b'"a"' not in seen:
        seen += client.recv(65536)
    client.close()
    assert scripted.closed_by_hop.wait(5)  # closing it is what stops llama-server's generation
    _pooled(pooled_hop, 0)
    assert _chat(pooled_hop)[0] == 200
    assert scripted.accepts == 2


def test_connection_close_from_upstream_is_honoured(scripted, pooled_hop) -> None:
    scripted.script = ["close", "sse"]
    status, body = _chat(pooled_hop)
    assert status == 200 and b"[DONE]" in body
    assert scripted.closed_by_hop.wait(5)
    _pooled(pooled_hop, 0)
    assert _chat(pooled_hop)[0] == 200
    assert scripted.accepts == 2


def test_a_kept_connection_closed_under_the_request_is_retried_once_on_a_new_one(scripted, pooled_hop) -> None:
    scripted.script = ["sse", "drop", "sse"]
    assert _chat(pooled_hop)[0] == 200
    _pooled(pooled_hop, 1)
    status, body = _chat(pooled_hop)
    assert status == 200 and b"[DONE]" in body
    assert scripted.accepts == 2 and len(scripted.requests) == 3
    assert scripted.requests[1] == scripted.requests[2]  # the same request, whole, on the new connection


def test_a_new_connection_that_closes_without_an_answer_is_not_retried(scripted, pooled_hop) -> None:
    scripted.script = ["drop", "sse"]
    status, _ = _chat(pooled_hop)
    assert status == 502
    assert scripted.accepts == 1 and len(scripted.requests) == 1


def test_idle_connections_are_closed_after_a_while(scripted, pooled_hop, monkeypatch) -> None:
    monkeypatch.setattr(upstream_pool, "UPSTREAM_IDLE_S", 0.2)
    scripted.script = ["close"]
    assert _chat(pooled_hop)[0] == 200 and _chat(pooled_hop)[0] == 200
    _pooled(pooled_hop, 1)
    _pooled(pooled_hop, 0)
    assert scripted.accepts == 2


def test_a_connection_closed_while_idle_is_not_used(scripted, pooled_hop) -> None:
    assert _chat(pooled_hop)[0] == 200
    _pooled(pooled_hop, 1)
    scripted.close_idle()
    time.sleep(0.2)  # the hop's loop sees the close
    status, body = _chat(pooled_hop)
    assert status == 200 and b"[DONE]" in body
    assert scripted.accepts == 2
