"""The front over real HTTP, against the hop tests' scripted llama-server: SageMaker's two routes and nothing else.

The stand-in checks an API key like llama-server with --api-key; the front forwards headers unchanged, so the
client sends one here (SageMaker strips Authorization; the real-server tests run llama-server without a key).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gguf_serve.container.sagemaker.contract import IAM_GATE
from gguf_serve.container.sagemaker.front import SageMakerFront
from tests.container.hop.conftest import KEY, Upstream, upstream  # noqa: F401 - the fixture

AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


@pytest.fixture
def front(upstream: Upstream) -> Iterator[SageMakerFront]:  # noqa: F811
    server = SageMakerFront(("127.0.0.1", 0), upstream.url, gate=IAM_GATE)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _request(server, method: str, path: str, body: dict | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers or {})
    response = conn.getresponse()
    return response.status, response.read(), conn


def test_ping_is_llama_servers_health(front, upstream):  # noqa: F811
    status, body, _ = _request(front, "GET", "/ping")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert upstream.seen[-1]["path"] == "/health"


def test_ping_answers_503_fast_while_nothing_listens_behind_it():
    with socket.socket() as s:  # a port nobody listens on: llama-server not started yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = SageMakerFront(("127.0.0.1", 0), f"http://127.0.0.1:{port}", gate=IAM_GATE)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        status, _, _ = _request(server, "GET", "/ping")
        assert status == 503 and time.monotonic() - started < 1.0
    finally:
        server.shutdown()
        server.server_close()


def test_an_invocation_is_a_chat_completion_by_default(front, upstream):  # noqa: F811
    status, body, _ = _request(front, "POST", "/invocations", {"messages": [], "max_tokens": 4}, AUTH)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "abcd"
    assert upstream.seen[-1]["method"] == "POST" and upstream.seen[-1]["path"] == "/v1/chat/completions"
    assert upstream.seen[-1]["body"] == {"messages": [], "max_tokens": 4}


def test_custom_attributes_pick_a_listed_route_and_nothing_else(front, upstream):  # noqa: F811
    headers = {**AUTH, "X-Amzn-SageMaker-Custom-Attributes": "route=/v1/completions"}
    status, _, _ = _request(front, "POST", "/invocations", {"prompt": "x"}, headers)
    assert status == 200 and upstream.seen[-1]["path"] == "/v1/completions"
    seen = len(upstream.seen)
    headers["X-Amzn-SageMaker-Custom-Attributes"] = "route=/slots"
    status, body, _ = _request(front, "POST", "/invocations", {"prompt": "x"}, headers)
    assert status == 400 and "is not served here" in json.loads(body)["error"]["message"]
    assert len(upstream.seen) == seen  # refused at the front


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/")])
def test_llama_servers_own_routes_are_not_served(front, upstream, method, path):  # noqa: F811
    status, body, _ = _request(front, method, path, {} if method == "POST" else None, AUTH)
    assert status == 404 and "serves GET /ping and POST /invocations only" in json.loads(body)["error"]["message"]
    assert not upstream.seen


def test_a_streamed_invocation_arrives_as_it_is_generated(front, upstream):  # noqa: F811
    """The stand-in holds the second half of its stream until `gate`: the first tokens must already be out."""
    conn = http.client.HTTPConnection("127.0.0.1", front.server_address[1], timeout=10)
    conn.request("POST", "/invocations", body=json.dumps({"stream": True}), headers=AUTH)
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    early = b""
    while b'"content":"b"' not in early:
        early += response.read1(65536)  # returns when the front has relayed something, before the gate opens
    assert not upstream.gate.is_set()
    upstream.gate.set()
    rest = response.read()
    assert b"[DONE]" in rest and b'"content":"d"' in rest
