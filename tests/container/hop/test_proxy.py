"""The hop over real HTTP against a scripted llama-server stand-in: streaming, the key, /metrics, failures."""

from __future__ import annotations

import http.client
import json
import socket
import time

from gguf_serve.container.hop import names
from gguf_serve.container.hop.proxy import ProxyServer
from gguf_serve.container.metrics.prometheus import parse_prometheus

from .conftest import KEY, TEST_GATE, Upstream, hop_url


def _post(server: ProxyServer, body: dict, key: str | None = KEY) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    return conn.getresponse()


def _metrics(server: ProxyServer, key: str | None = KEY, headers: dict | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    r = conn.getresponse()
    if headers is not None:
        headers.update(r.getheaders())
    return r.status, r.read().decode()


def _recorded(server: ProxyServer, n: int) -> None:
    deadline = time.monotonic() + 5
    while server.metrics.histograms[names.DURATION].snapshot()[2] < n:
        assert time.monotonic() < deadline, f"fewer than {n} requests recorded"
        time.sleep(0.01)


def test_stream_arrives_piece_by_piece_not_buffered(upstream: Upstream, hop: ProxyServer) -> None:
    r = _post(hop, {"stream": True, "messages": []})
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    seen = b""
    deadline = time.monotonic() + 5
    while b'"content":"b"' not in seen:  # upstream holds the rest until the gate opens
        assert time.monotonic() < deadline, f"first tokens not relayed while upstream waits: {seen!r}"
        seen += r.read1(65536)
    assert b'"content":"c"' not in seen
    upstream.gate.set()
    seen += r.read()
    assert seen.endswith(b"data: [DONE]\n\n") and seen.count(b"data: ") == 7
    _recorded(hop, 1)  # the hop records a request after its last byte went out
    status, text = _metrics(hop)
    fam = parse_prometheus(text)
    assert fam[names.TTFT].samples[-1].value == 1
    assert fam[names.ITL].samples[-1].value == 3  # a-b, b-c, c-d
    assert fam[names.ITL].samples[-2].value > 0  # the b-c gap spans the gate
    assert fam[names.DECODE_TPS].samples[-2].value == 20.0
    assert fam[names.REQUESTS].value(code="200", stream="true") == 1


def test_key_goes_upstream_unchanged_and_hop_headers_do_not(upstream: Upstream, hop: ProxyServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=10)
    conn.request(
        "POST",
        "/v1/chat/completions?x=1",
        json.dumps({"stream": False}),
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", "Proxy-Authorization": "Basic x",
         "X-Request-Id": "r1", "Connection": "keep-alive"},
    )  # fmt: skip
    assert conn.getresponse().read()
    seen = upstream.seen[-1]
    assert seen["path"] == "/v1/chat/completions?x=1"
    assert seen["headers"]["Authorization"] == f"Bearer {KEY}" and seen["headers"]["X-Request-Id"] == "r1"
    assert "Proxy-Authorization" not in seen["headers"]
    assert seen["headers"]["Host"] == upstream.url.removeprefix("http://")


def test_without_the_key_upstream_refuses_and_the_hop_relays_it(upstream: Upstream, hop: ProxyServer) -> None:
    r = _post(hop, {"stream": True}, key=None)
    assert r.status == 401 and b"Invalid API Key" in r.read()
    status, body = _metrics(hop, key=None)
    assert status == 401 and names.TTFT not in body  # the histograms are behind the same key
    status, body = _metrics(hop, key="wrong")
    assert status == 401


def test_metrics_are_llama_servers_then_the_hops(upstream: Upstream, hop: ProxyServer) -> None:
    _post(hop, {"stream": False}).read()
    _recorded(hop, 1)
    headers: dict = {}
    status, text = _metrics(hop, headers=headers)
    assert headers["Process-Start-Time-Unix"] == "1700000000"  # the metrics publisher detects server restarts by it
    fam = parse_prometheus(text)
    assert status == 200 and fam["llamacpp:requests_processing"].value() == 0
    assert set(names.HISTOGRAMS) <= set(fam) and all(fam[n].type == "histogram" for n in names.HISTOGRAMS)
    assert fam[names.REQUESTS].value(code="200", stream="false") == 1
    assert fam[names.TTFT].samples[-1].value == 1


def test_keep_alive_serves_several_requests_on_one_connection(upstream: Upstream, hop: ProxyServer) -> None:
    upstream.gate.set()
    conn = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=10)
    for stream in (True, False, True):
        conn.request("POST", "/v1/chat/completions", json.dumps({"stream": stream}), {"Authorization": f"Bearer {KEY}"})
        body = conn.getresponse().read()
        assert body.endswith(b"[DONE]\n\n") if stream else json.loads(body)["timings"]
    conn.request("GET", "/health")
    assert json.loads(conn.getresponse().read()) == {"status": "ok"}


def test_upstream_down_is_a_502_counted(upstream: Upstream) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    server = ProxyServer(("127.0.0.1", 0), dead, gate=TEST_GATE)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = _post(server, {"stream": True})
        assert r.status == 502 and b"not reachable" in r.read()
        assert server.metrics.exposition().count('code="502"') == 1
    finally:
        server.shutdown()
        server.server_close()


def test_client_leaving_mid_stream_closes_upstream(upstream: Upstream, hop: ProxyServer) -> None:
    with socket.create_connection(("127.0.0.1", hop.server_address[1])) as s:
        body = json.dumps({"stream": True}).encode()
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
        )  # fmt: skip
        s.recv(65536)  # the head and the first pieces: the stream is under way
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    upstream.gate.set()
    assert upstream.stream_closed.wait(5), "upstream kept streaming to a hop whose client left"
    deadline = time.monotonic() + 5
    while 'code="client_closed"' not in hop.metrics.exposition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_hop_url_helper_matches_the_listening_port(hop: ProxyServer) -> None:
    assert hop_url(hop).endswith(str(hop.server_address[1]))
