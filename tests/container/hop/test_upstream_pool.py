"""The hop keeps connections to llama-server alive between requests, and only clean ones: a scripted upstream over
raw sockets counts its accepts and answers each request as its script says (llama-server's keep-alive framing)."""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_serve.container.hop import upstream as upstream_pool
from gguf_serve.container.hop.proxy import ProxyServer
from gguf_serve.local.process import free_port

from .conftest import KEY


@pytest.fixture
def pooled_hop(make_pooled_hop) -> ProxyServer:
    return make_pooled_hop()


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


def test_a_client_that_closes_right_after_its_request_closes_the_upstream_connection(scripted, pooled_hop) -> None:
    """The request and the client's FIN in one go: the hop has the EOF before the relay starts watching for it
    (the relay's first wait is where it stops), and llama-server's connection is closed, not kept."""
    scripted.script = ["hang", "sse"]
    client = socket.create_connection(("127.0.0.1", pooled_hop.server_address[1]), timeout=10)
    body = json.dumps({"stream": True, "messages": []}).encode()
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\n"
                   b"Content-Length: %d\r\n\r\n%b" % (KEY.encode(), len(body), body))  # fmt: skip
    client.shutdown(socket.SHUT_WR)
    try:
        assert scripted.closed_by_hop.wait(5)
    finally:
        client.close()
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


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_every_upstream_connection_the_hop_closes_leaves_no_descriptor(scripted, pooled_hop) -> None:
    """Each upstream connection holds a second descriptor (for an answer left unread by a reset, upstream.py): the
    ends that close it (llama-server's Connection: close, a cut answer, a close without an answer) close both."""
    assert _chat(pooled_hop)[0] == 200  # the hop's loop, pool and first connection exist before the count
    _pooled(pooled_hop, 1)
    before = _descriptors()
    rounds = 8
    scripted.script = ["close", "cut", "drop"] * rounds
    statuses = [_chat(pooled_hop)[0] for _ in range(3 * rounds)]
    assert statuses.count(200) == rounds and statuses.count(-1) == rounds, statuses
    deadline = time.monotonic() + 5
    while (left := _descriptors() - before) > 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the hop's loop closes what the last answers ended
    assert left <= 2, f"{left} descriptors more than before {3 * rounds} closed upstream connections"


def test_the_open_file_limit_covers_two_descriptors_per_upstream_connection() -> None:
    """The hop, started as the image starts it, raises its soft open-file limit for every client connection and its
    upstream one, which holds two descriptors (gguf_serve/container/hop/cli.py)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    connections = 1000 + 64  # --max-connections and the overflow that answers /health only (Limits)
    if hard != resource.RLIM_INFINITY and hard < 3 * connections + 164:
        pytest.skip(f"this machine's hard open-file limit ({hard}) is under what the check needs")
    cmd = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{free_port()}", "--upstream",
           "http://127.0.0.1:9", "--gpu-metrics", "off", "--max-connections", "1000", "--no-api-key", "t"]  # fmt: skip
    hop = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))  # fmt: skip
    try:
        assert hop.stderr is not None
        started = next((line for line in hop.stderr if "listening on" in line), None)
        assert started is not None, "the hop did not start"
        limits = Path(f"/proc/{hop.pid}/limits").read_text()
    finally:
        hop.terminate()
        hop.wait(10)
    soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
    assert int(soft) >= 3 * connections + 100, limits
