"""The hop against hostile and careless clients, over raw sockets, in front of the scripted llama-server stand-in:
RFC 9112 framing, timeouts, the body cap, connection limits, admission control and honest counts."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time

import pytest

from gguf_serve.container.hop import names
from gguf_serve.container.hop.proxy import Admission, Limits, ProxyServer
from gguf_serve.container.metrics.prometheus import parse_prometheus

from .conftest import KEY, TEST_GATE, Upstream, UpstreamHandler

BODY = b'{"stream":false}'


def _raw(server: ProxyServer, data: bytes, *, timeout: float = 5.0) -> bytes:
    """Send bytes, then read until the hop closes or goes quiet for a moment."""
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=timeout) as s:
        s.sendall(data)
        return _read_all(s)


def _read_all(s: socket.socket, quiet: float = 0.5) -> bytes:
    out = b""
    s.settimeout(quiet)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            data = s.recv(65536)
        except TimeoutError:
            if out:
                break
            continue
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return out


def _post_head(*headers: bytes, target: bytes = b"/v1/chat/completions") -> bytes:
    lines = [b"POST " + target + b" HTTP/1.1", b"Host: x", b"Authorization: Bearer " + KEY.encode(), *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


@pytest.mark.parametrize(
    "head",
    [
        _post_head(b"Content-Length: 1_6"),
        _post_head(b"Content-Length: +16"),
        _post_head(b"Content-Length: 0x10"),
        _post_head(b"Content-Length: 16", b"Content-Length: 0"),  # two lengths: which one frames the body?
        _post_head(b"Content-Length: 16", b"Content-Length: 16"),  # equal, still two: refused, not collapsed
        _post_head(b"content-length: 16", b"X-A: b", b"CONTENT-LENGTH: 16"),
        _post_head(b"Content-Length: 16, 0"),
        _post_head(b"Content-Length : 16"),  # whitespace before the colon
        _post_head(b"X-Trace: a\rContent-Length: 16"),  # a bare CR inside a field
        _post_head(b"Content-Length: 16", b"Transfer-Encoding: chunked"),
        _post_head(b"Transfer-Encoding: chunked", b"Content-Length: 16"),
        _post_head(b"Transfer-Encoding: gzip, chunked"),
        _post_head(b"Content-Length: 16", target=b"http://evil.example/v1/chat/completions"),
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 16\r\n\r\n",  # HTTP/1.1 without Host
    ],
    ids=[
        "underscore",
        "plus",
        "hex",
        "two-lengths",
        "two-equal-lengths",
        "two-equal-lengths-apart",
        "length-list",
        "space-before-colon",
        "bare-cr",
        "cl-and-te",
        "te-and-cl",
        "te-not-chunked",
        "absolute-form",
        "no-host",
    ],
)
def test_ambiguous_framing_is_refused_and_never_forwarded(upstream: Upstream, hop: ProxyServer, head: bytes) -> None:
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    # with Transfer-Encoding, a well-formed chunked body: refused for the framing, not for the bytes after it
    body = b"%x\r\n%b\r\n0\r\n\r\n" % (len(BODY), BODY) if b"transfer-encoding" in head.lower() else BODY
    answer = _raw(hop, head + body + smuggled)
    assert 400 <= _status(answer) < 600 and _status(answer) != 502, answer[:300]
    assert answer.count(b"HTTP/1.1 ") == 1, "the hop went on reading after a framing error"
    assert b"connection: close" in answer.lower()
    assert upstream.seen == [], f"forwarded: {upstream.seen}"


def test_one_length_is_forwarded_as_one(upstream: Upstream, hop: ProxyServer) -> None:
    answer = _raw(hop, _post_head(b"Content-Length: 16") + BODY)
    assert _status(answer) == 200
    assert upstream.seen[-1]["lengths"] == ["16"]


def test_absurd_length_is_413_without_reading_or_forwarding(upstream: Upstream, hop: ProxyServer) -> None:
    answer = _raw(hop, _post_head(b"Content-Length: 10000000000000") + b"{")
    assert _status(answer) == 413 and b"invalid_request_error" in answer
    assert upstream.seen == []
    r = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=5)
    r.request("GET", "/health")
    assert r.getresponse().status == 200  # the hop is fine


def test_chunked_body_over_the_cap_is_413(upstream: Upstream, make_hop) -> None:
    server = make_hop(limits=Limits(max_body_bytes=1000))
    chunk = b"%x\r\n%b\r\n" % (600, b"x" * 600)
    answer = _raw(server, _post_head(b"Transfer-Encoding: chunked") + chunk + chunk + b"0\r\n\r\n")
    assert _status(answer) == 413
    assert not [s for s in upstream.seen if s["method"] == "POST"]  # the stand-in never got a whole body


def test_chunked_body_is_forwarded_chunked(upstream: Upstream, hop: ProxyServer) -> None:
    chunked = b"%x\r\n%b\r\n0\r\n\r\n" % (len(BODY), BODY)
    answer = _raw(hop, _post_head(b"Transfer-Encoding: chunked") + chunked)
    assert _status(answer) == 200 and b"timings" in answer
    assert upstream.seen[-1]["body"] == {"stream": False} and upstream.seen[-1]["lengths"] == []


def test_oversized_headers_are_431(upstream: Upstream, hop: ProxyServer) -> None:
    answer = _raw(hop, _post_head(b"X-Big: " + b"a" * 40000, b"Content-Length: 16") + BODY)
    assert _status(answer) == 431
    assert upstream.seen == []


def test_slow_headers_are_cut_with_408(upstream: Upstream, make_hop) -> None:
    server = make_hop(limits=Limits(header_timeout_s=0.5))
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):  # a byte now and then does not extend the deadline
            time.sleep(0.2)
            with contextlib.suppress(OSError):
                s.sendall(b"X")
        answer = _read_all(s, quiet=2)
    assert _status(answer) == 408
    assert upstream.seen == []


def test_idle_keep_alive_connection_is_closed(make_hop) -> None:
    server = make_hop(limits=Limits(idle_timeout_s=0.3))
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b'"status": "ok"' not in first:
            first += s.recv(65536)
        assert _status(first) == 200
        s.settimeout(5)
        assert s.recv(65536) == b"", "an idle connection stayed open past idle_timeout_s"


def test_stalled_body_is_cut_and_never_completes_upstream(upstream: Upstream, make_hop) -> None:
    server = make_hop(limits=Limits(body_timeout_s=0.3))
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
        s.sendall(_post_head(b"Content-Length: 16") + BODY[:5])
        s.settimeout(5)
        assert _read_all(s, quiet=3) == b""  # the hop hangs up: nothing to answer for half a request
    assert not [x for x in upstream.seen if x["method"] == "POST"]


def test_idle_connections_cost_no_thread_and_health_still_answers(hop: ProxyServer) -> None:
    threads = threading.active_count()
    conns = [socket.create_connection(("127.0.0.1", hop.server_address[1])) for _ in range(300)]
    try:
        for c in conns[::2]:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")  # half a head
        r = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=5)
        r.request("GET", "/health")
        assert r.getresponse().status == 200
        assert threading.active_count() <= threads + 2, "a thread per connection"
        status, text = _get(hop, "/metrics")
        assert parse_prometheus(text)[names.CONNECTIONS].value() >= 300
    finally:
        for c in conns:
            c.close()


def test_connection_cap_evicts_the_longest_idle(make_hop) -> None:
    server = make_hop(limits=Limits(max_connections=5))
    port = server.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    time.sleep(0.2)  # accepted before the next one arrives
    try:
        status, _ = _get(server, "/health")
        assert status == 200
        held[0].settimeout(5)
        assert held[0].recv(1) == b"", "the oldest idle connection should have been closed"
    finally:
        for c in held:
            c.close()


def test_body_streams_upstream_before_the_client_finishes() -> None:
    with socket.create_server(("127.0.0.1", 0)) as fake_upstream:
        server = ProxyServer(("127.0.0.1", 0), f"http://127.0.0.1:{fake_upstream.getsockname()[1]}", gate=TEST_GATE)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            size = 8 * 1024 * 1024
            with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as client:
                client.sendall(_post_head(b"Content-Length: %d" % size) + b"x" * 100_000)
                fake_upstream.settimeout(5)
                up, _ = fake_upstream.accept()
                with up:
                    up.settimeout(5)
                    got = b""
                    while len(got.partition(b"\r\n\r\n")[2]) < 100_000:
                        got += up.recv(65536)
                    head = got.partition(b"\r\n\r\n")[0].lower()
                    assert b"content-length: %d" % size in head and b"authorization: bearer" in head
                    # the client has sent 100 kB of 8 MiB: the hop forwards as it reads, never the whole body first
        finally:
            server.shutdown()
            server.server_close()


def _get(server: ProxyServer, path: str, key: str | None = KEY) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    c.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    r = c.getresponse()
    return r.status, r.read().decode()


def _post(server: ProxyServer, body: dict) -> http.client.HTTPResponse:
    c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {KEY}"})
    return c.getresponse()


def test_past_the_admission_limit_answers_429_and_counts_it(upstream: Upstream, make_hop) -> None:
    server = make_hop(admission=Admission(slots=1, queue_per_slot=1, retry_after_s=3))
    first, second = _post(server, {"stream": True}), _post(server, {"stream": True})  # held at the gate
    assert first.status == second.status == 200
    refused = _post(server, {"stream": True})
    assert refused.status == 429 and refused.getheader("Retry-After") == "3"
    error = json.loads(refused.read())["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == 429 and "retry" in error["message"]
    assert _get(server, "/health")[0] == 200
    fam = parse_prometheus(_get(server, "/metrics")[1])
    assert fam[names.SHED].value() == 1 and fam[names.IN_FLIGHT].value() == 2
    assert fam[names.ADMISSION_LIMIT].value() == 2
    assert fam[names.REQUESTS].value(code="429", stream="false") == 1
    assert len([s for s in upstream.seen if s["method"] == "POST"]) == 2  # the third never reached llama-server
    upstream.gate.set()
    first.read(), second.read()
    assert _post(server, {"stream": False}).status == 200  # slots free again: admitted


def test_429_keeps_the_connection_when_the_body_is_small(upstream: Upstream, make_hop) -> None:
    server = make_hop(admission=Admission(slots=1, queue_per_slot=0))
    held = _post(server, {"stream": True})
    c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    c.request("POST", "/v1/chat/completions", json.dumps({"stream": True}), {"Authorization": f"Bearer {KEY}"})
    r = c.getresponse()
    assert r.status == 429 and r.read()
    c.request("GET", "/health")  # the same connection goes on
    assert c.getresponse().status == 200
    upstream.gate.set()
    held.read()


def test_health_answers_while_upstream_is_busy(upstream: Upstream, make_hop) -> None:
    """llama-server that does not answer /health in time while it streams: the hop answers from what it saw."""
    server = make_hop(limits=Limits(health_timeout_s=0.2))
    stream = _post(server, {"stream": True})
    stream.read1(65536)  # bytes from upstream just now
    slow = threading.Event()
    original = UpstreamHandler.do_GET

    def slow_get(handler) -> None:
        if handler.path == "/health":
            slow.wait(3)
        original(handler)

    UpstreamHandler.do_GET = slow_get
    try:
        status, body = _get(server, "/health", key=None)
        assert status == 200 and json.loads(body) == {"status": "ok"}
    finally:
        UpstreamHandler.do_GET = original
        slow.set()
        upstream.gate.set()
        stream.read()


def test_upstream_down_health_is_503(make_hop) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    server = make_hop(dead)
    status, body = _get(server, "/health", key=None)
    assert status == 503 and json.loads(body)["error"]["type"] == "unavailable_error"


def test_stream_cut_by_upstream_is_an_error_not_a_200(upstream: Upstream, hop: ProxyServer) -> None:
    r = _post(hop, {"stream": True, "crash": True})
    assert r.status == 200  # the head went out before the crash
    with pytest.raises(http.client.IncompleteRead):
        r.read()  # no final chunk: the client can tell the answer is cut
    deadline = time.monotonic() + 5
    while 'code="upstream_closed"' not in hop.metrics.exposition():
        assert time.monotonic() < deadline, hop.metrics.exposition()
        time.sleep(0.02)
    assert 'code="200"' not in hop.metrics.exposition()


def test_client_leaving_a_non_streamed_request_closes_upstream(upstream: Upstream, hop: ProxyServer) -> None:
    with socket.create_connection(("127.0.0.1", hop.server_address[1])) as s:
        body = json.dumps({"stream": False, "hold": True}).encode()
        s.sendall(_post_head(b"Content-Length: %d" % len(body)) + body)
        assert upstream.held.wait(5)
    assert upstream.hold_closed.wait(5), "the hop kept upstream open after its client left"
    deadline = time.monotonic() + 5
    while 'code="client_closed",stream="false"' not in hop.metrics.exposition():
        assert time.monotonic() < deadline, hop.metrics.exposition()
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("path", "hop_answers"),
    [("/metrics", True), ("/metrics?x=1", True), ("/%6detrics", True), ("//metrics", False), ("/metrics/", False)],
)
def test_metrics_route_matches_llama_servers_routing(upstream: Upstream, hop: ProxyServer, path, hop_answers) -> None:
    status, text = _get(hop, path)
    assert status == 200
    assert (names.REQUESTS in text) is hop_answers
    assert upstream.seen[-1]["target"] == path  # forwarded as sent


def test_pipelined_requests_are_answered_in_order(upstream: Upstream, hop: ProxyServer) -> None:
    one = _post_head(b"Content-Length: 16") + BODY
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _raw(hop, one + health + one)
    assert answer.count(b"HTTP/1.1 200") == 3
    assert answer.index(b'"status": "ok"') > answer.index(b"timings") and answer.rindex(b"timings") > answer.index(
        b'"status": "ok"'
    )


def test_expect_100_continue(upstream: Upstream, hop: ProxyServer) -> None:
    with socket.create_connection(("127.0.0.1", hop.server_address[1]), timeout=5) as s:
        s.sendall(_post_head(b"Content-Length: 16", b"Expect: 100-continue"))
        assert s.recv(65536).startswith(b"HTTP/1.1 100 ")
        s.sendall(BODY)
        assert _status(_read_all(s)) == 200
    assert "Expect" not in upstream.seen[-1]["headers"]


def test_head_gets_no_body(upstream: Upstream, hop: ProxyServer) -> None:
    c = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=5)
    c.request("HEAD", "/v1/models")
    r = c.getresponse()
    assert r.read() == b""
    c.request("GET", "/health")
    assert c.getresponse().status == 200
