"""Hostile input, round 3 (issue 31), at the hop over raw sockets: a client without the key, or one that sends its
body slowly, or thousands of connections at once, cannot take the port, an admission place or the health check."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from gguf_serve.container.hop import names
from gguf_serve.container.hop.auth import UNAUTHORIZED_BODY, ApiKeys
from gguf_serve.container.hop.proxy import Admission, Limits, ProxyServer
from gguf_serve.container.metrics.prometheus import parse_prometheus

from .conftest import KEY, Upstream

LINGER_S = 2.0  # the hop's half-close linger after an answer to a request whose body is still coming


def _connect(server: ProxyServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)


def _head(s: socket.socket) -> bytes:
    """The bytes up to the end of the first answer's body (its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = s.recv(65536)
        if not piece:
            break
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(v) for n, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
                   if n.strip().lower() == b"content-length"), 0)  # fmt: skip
    while len(rest) < length:
        rest += s.recv(65536)
    return head + b"\r\n\r\n" + rest


def _held_open_s(s: socket.socket, *, every_s: float = 0.1, limit_s: float = 8.0) -> float:
    """Trickle a body byte every `every_s` until the hop closes the connection; the seconds that took (or limit_s)."""
    s.settimeout(every_s)
    start = time.monotonic()
    while (held := time.monotonic() - start) < limit_s:
        try:
            s.sendall(b"x")
            if s.recv(65536) == b"":
                return held
        except TimeoutError:
            continue
        except OSError:
            return held
    return limit_s


def _post(server: ProxyServer, body: dict, headers: dict | None = None) -> http.client.HTTPResponse:
    c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {KEY}"} if headers is None
              else headers)  # fmt: skip
    return c.getresponse()


def _families(server: ProxyServer) -> dict:
    return parse_prometheus(server.hop_exposition())


def test_a_refusal_before_the_body_arrived_closes_the_connection(upstream: Upstream, make_hop) -> None:
    """A 429 to a request whose body is still coming: the hop no longer reads up to 1 MiB of it at 30 s a piece."""
    server = make_hop(admission=Admission(slots=1, queue_per_slot=0))
    held = _post(server, {"stream": True})  # the one admission place
    with _connect(server) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\n"
                  b"Content-Length: 100000\r\n\r\n{" % KEY.encode())  # fmt: skip
        answer = _head(s)
        assert answer.startswith(b"HTTP/1.1 429") and b"connection: close" in answer.lower()
        held_s = _held_open_s(s)
    print(f"a 429 before its body: connection held {held_s:.1f} s while the client trickled")
    assert held_s <= LINGER_S + 1.5, f"the hop kept reading the refused body for {held_s:.1f} s"
    upstream.gate.set()
    held.read()


def test_a_keyless_request_is_answered_at_its_head(upstream: Upstream, make_hop) -> None:
    server = make_hop(keys=ApiKeys([KEY]))
    with _connect(server) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 1048576\r\n\r\n")  # fmt: skip
        answer = _head(s)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:80]  # no "100 Continue" to a keyless client
        head, _, body = answer.partition(b"\r\n\r\n")
        assert body == UNAUTHORIZED_BODY and b"connection: close" in head.lower()
        assert json.loads(body)["error"]["type"] == "authentication_error"  # what llama-server answers
        held_s = _held_open_s(s)
    assert held_s <= LINGER_S + 1.5
    assert upstream.seen == []  # nothing forwarded: llama-server never saw it
    assert _families(server)[names.UNAUTHORIZED].value() == 1


def test_keyless_requests_hold_no_admission_place_and_are_not_shed(upstream: Upstream, make_hop) -> None:
    """llama-server busy (its 401 takes a second): keyless requests used to hold the one place and shed keyed ones."""
    server = make_hop(admission=Admission(slots=1, queue_per_slot=0), keys=ApiKeys([KEY]))
    upstream.keyless_pause_s = 1.0
    statuses: list[int] = []

    def keyless() -> None:
        r = _post(server, {"stream": False}, headers={"Authorization": "Bearer nope"})
        statuses.append(r.status)
        r.read()

    threads = [threading.Thread(target=keyless) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    keyed = _post(server, {"stream": False})
    keyed_status = keyed.status
    keyed.read()
    for t in threads:
        t.join(10)
    fam = _families(server)
    print(f"8 keyless + 1 keyed at 1 place: keyless {sorted(statuses)}, keyed {keyed_status}, "
          f"shed {fam[names.SHED].value()}")  # fmt: skip
    assert keyed_status == 200, "a keyed request was shed while keyless ones held the place"
    assert statuses == [401] * 8 and fam[names.SHED].value() == 0
    assert fam[names.UNAUTHORIZED].value() == 8
    assert [s for s in upstream.seen if s["headers"].get("Authorization") != f"Bearer {KEY}"] == []


@pytest.mark.parametrize(
    ("headers", "forwarded"),
    [
        ({"Authorization": f"Bearer {KEY}"}, True),
        ({"Authorization": KEY}, True),  # llama-server strips "Bearer " only when it is there
        ({"X-Api-Key": KEY}, True),  # the Anthropic header, read when Authorization is empty
        ({"Authorization": "", "X-Api-Key": KEY}, True),
        ({"Authorization": "Bearer wrong", "X-Api-Key": KEY}, False),  # Authorization wins when it is set
        ({"Authorization": f"bearer {KEY}"}, False),  # the prefix is case-sensitive in llama-server
        ({"Authorization": f"Bearer {KEY} "}, True),  # trailing whitespace is not part of a field value (RFC 9110)
        ({"Authorization": f"Bearer  {KEY}"}, False),
        ({"Authorization": f"Bearer {KEY[:-1]}"}, False),
        ({}, False),
    ],
    ids=[
        "bearer",
        "bare",
        "x-api-key",
        "empty-authorization",
        "wrong-bearer-right-x",
        "lowercase-bearer",
        "trailing-space",
        "two-spaces",
        "prefix-of-key",
        "none",
    ],  # fmt: skip
)
def test_the_credential_is_read_as_llama_server_reads_it(upstream: Upstream, make_hop, headers, forwarded) -> None:
    server = make_hop(keys=ApiKeys([KEY]))
    r = _post(server, {"stream": False}, headers=headers)
    body = r.read()
    assert bool(upstream.seen) is forwarded, (r.status, body)  # the stand-in takes "Bearer <key>" only: not checked
    if not forwarded:
        assert r.status == 401 and body == UNAUTHORIZED_BODY


def test_public_reads_pass_keyless_and_keyed_api_reads_get_401(upstream: Upstream, make_hop) -> None:
    server = make_hop(keys=ApiKeys([KEY]))
    c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    c.request("GET", "/health")
    assert c.getresponse().read() and upstream.seen[-1]["path"] == "/health"
    c.request("GET", "/bundle.js")  # a web UI asset: public in llama-server, its decision
    c.getresponse().read()
    assert upstream.seen[-1]["path"] == "/bundle.js"
    seen = len(upstream.seen)
    for route in ("/metrics", "/slots", "/props", "/v1/models"):  # its API: keyed, answered here (round 4)
        c.request("GET", route)
        answer = c.getresponse()
        assert answer.status == 401 and answer.read() == UNAUTHORIZED_BODY, route
    assert len(upstream.seen) == seen  # none reached llama-server


def test_a_body_has_a_total_deadline(upstream: Upstream, make_hop) -> None:
    server = make_hop(limits=Limits(body_timeout_s=1.0, body_deadline_s=0.6))
    with _connect(server) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\n"
                  b"Content-Length: 1000\r\n\r\n{" % KEY.encode())  # fmt: skip
        start = time.monotonic()
        s.settimeout(0.1)
        answer = b""
        while not answer and time.monotonic() - start < 5:  # a byte every 0.1 s: never 1 s between pieces
            with contextlib.suppress(TimeoutError):
                s.sendall(b" ")
                answer = s.recv(65536)
        took = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408 ") and took < 2, (answer[:60], took)
    assert not [x for x in upstream.seen if x["method"] == "POST"]


def _open(conns: list[socket.socket]) -> int:
    """How many of these client sockets the hop has not closed."""
    alive = 0
    for c in conns:
        c.setblocking(False)
        try:
            alive += c.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def test_the_connection_cap_holds_under_a_burst(make_hop) -> None:
    cap, burst = 16, 400
    server = make_hop(limits=Limits(max_connections=cap))
    fds_before = len(os.listdir("/proc/self/fd"))
    conns = [socket.create_connection(("127.0.0.1", server.server_address[1])) for _ in range(burst)]
    try:
        time.sleep(0.5)  # accepted and settled
        open_now = _open(conns)
        fam = _families(server)
        hop_fds = len(os.listdir("/proc/self/fd")) - fds_before - burst  # the hop's sockets, in this process
        print(f"burst of {burst} silent connections at a cap of {cap}: {open_now} left open, hop count "
              f"{fam[names.CONNECTIONS].value()}, hop fds {hop_fds}")  # fmt: skip
        assert open_now <= cap and fam[names.CONNECTIONS].value() <= cap
        assert fam[names.CONNECTIONS_EVICTED].value() >= burst - cap
        assert hop_fds <= cap + 8
        status = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        status.request("GET", "/health")
        assert status.getresponse().status in (200, 503)
    finally:
        for c in conns:
            c.close()


def test_a_full_table_of_answers_still_answers_health(upstream: Upstream, make_hop) -> None:
    server = make_hop(limits=Limits(max_connections=3))
    streams = [_post(server, {"stream": True}) for _ in range(3)]  # every connection is streaming an answer
    try:
        c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        c.request("GET", "/health")
        health = c.getresponse()
        assert health.status == 200 and health.getheader("Connection") == "close"  # the check, then the room back
        r = _post(server, {"stream": False})
        assert r.status == 503 and r.getheader("Retry-After") and r.getheader("Connection") == "close"
    finally:
        upstream.gate.set()
        for s in streams:
            s.read()


def test_an_http_2_request_line_is_505(upstream: Upstream, hop: ProxyServer) -> None:
    with _connect(hop) as s:
        s.sendall(b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n")
        assert _head(s).startswith(b"HTTP/1.1 505 ")
    assert upstream.seen == []


def test_health_with_a_body_is_answered(upstream: Upstream, hop: ProxyServer) -> None:
    with _connect(hop) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        answer = _head(s)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert "Content-Length" not in upstream.seen[-1]["headers"]  # llama-server is not told of a body it never gets


def test_health_is_503_as_soon_as_llama_server_is_gone(make_hop) -> None:
    up = Upstream()
    threading.Thread(target=up.serve_forever, daemon=True).start()
    server = make_hop(up.url)
    assert _post(server, {"stream": False}).read()  # bytes from upstream just now
    up.shutdown()
    up.server_close()  # llama-server died: its port refuses connections
    c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    c.request("GET", "/health")
    assert c.getresponse().status == 503


def test_sigterm_with_connections_open_logs_no_traceback(upstream: Upstream) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{port}", "--upstream",
               upstream.url, "--gpu-metrics", "off", "--no-api-key", "the test (loopback)"]  # fmt: skip
    hop = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    conns = []
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                break
            assert time.monotonic() < deadline and hop.poll() is None, "the hop did not listen"
            time.sleep(0.05)
        body = json.dumps({"stream": True}).encode()
        for i in range(12):
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:  # a stream held at the stand-in's gate: the hop waits on llama-server
                c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\n"
                          b"Content-Length: %d\r\n\r\n%b" % (KEY.encode(), len(body), body))  # fmt: skip
            else:
                c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            conns.append(c)
        time.sleep(0.5)
        hop.send_signal(signal.SIGTERM)
        _, err = hop.communicate(timeout=30)
    finally:
        if hop.poll() is None:
            hop.kill()
        for c in conns:
            c.close()
    assert hop.returncode == 0 and "Traceback" not in err, err[-2000:]
