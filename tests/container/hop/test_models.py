"""The hop knows the names its model answers to (models.py): a request naming another model gets OpenAI's 404
`model_not_found` with the names served here, before it takes an admission place and without reaching
llama-server; one of its names, or none, is forwarded; GET /v1/models lists exactly those names."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from gguf_serve.container.hop import names
from gguf_serve.container.hop.limits import Admission
from gguf_serve.container.hop.models import ServedModels
from tests.container.hop.conftest import KEY

SERVED = ServedModels(("Qwen3.6-35B-A3B", "qwen3.6-35b-a3b"))
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def _post(port: int, body: dict, conn: http.client.HTTPConnection | None = None) -> tuple[int, dict]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), AUTH)
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read())


def _chat(model: str | None) -> dict:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}  # `messages` first, as openai-python
    return {**body, "model": model} if model is not None else body


def _port(server) -> int:
    return server.server_address[1]


def test_another_models_name_is_refused_404_with_the_names_served_here(make_hop, upstream):
    server = make_hop(models=SERVED, admission=Admission(slots=1, queue_per_slot=0))
    status, doc = _post(_port(server), _chat("Qwen3.6-27B"))
    assert status == 404
    assert doc["error"]["code"] == "model_not_found" and doc["error"]["param"] == "model"
    assert doc["error"]["type"] == "invalid_request_error"
    assert "Qwen3.6-27B" in doc["error"]["message"] and "Qwen3.6-35B-A3B, qwen3.6-35b-a3b" in doc["error"]["message"]
    assert doc["models"] == list(SERVED.names)
    assert [s for s in upstream.seen if s["method"] == "POST"] == []  # never reached llama-server
    assert server.metrics.wrong_model == 1 and server.metrics.shed == 0 and server.in_flight == 0
    assert f"{names.WRONG_MODEL} 1" in server.hop_exposition()


@pytest.mark.parametrize("model", ["Qwen3.6-35B-A3B", "qwen3.6-35b-a3b", None])
def test_its_own_names_or_none_are_served(make_hop, upstream, model):
    server = make_hop(models=SERVED)
    status, doc = _post(_port(server), _chat(model))
    assert status == 200 and doc["choices"][0]["message"]["content"] == "abcd"
    assert upstream.seen[-1]["body"] == _chat(model)  # forwarded unchanged
    assert server.metrics.wrong_model == 0


def test_without_names_every_model_is_forwarded_as_before(make_hop, upstream):
    server = make_hop()
    status, _ = _post(_port(server), _chat("anything"))
    assert status == 200 and upstream.seen[-1]["body"]["model"] == "anything"


def test_the_connection_is_kept_after_a_refusal(make_hop, upstream):
    server = make_hop(models=SERVED)
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=10)
    assert _post(_port(server), _chat("Qwen3.6-27B"), conn)[0] == 404
    assert _post(_port(server), _chat("Qwen3.6-35B-A3B"), conn)[0] == 200  # the same connection
    assert server.metrics.wrong_model == 1


def test_a_body_that_arrives_after_its_head_is_read_before_it_is_judged(make_hop, upstream):
    server = make_hop(models=SERVED)
    body = json.dumps(_chat("Qwen3.6-27B")).encode()
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as s:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n" % KEY.encode()
        s.sendall(head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.sendall(body[:10])
        time.sleep(0.3)
        s.sendall(body[10:])
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 404") and b"model_not_found" in answer


def test_models_lists_exactly_the_names_served(make_hop, upstream):
    server = make_hop(models=SERVED)
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=10)
    conn.request("GET", "/v1/models", headers=AUTH)
    answer = conn.getresponse()
    doc = json.loads(answer.read())
    assert answer.status == 200 and [m["id"] for m in doc["data"]] == list(SERVED.names)
    assert doc["object"] == "list" and all(m["object"] == "model" for m in doc["data"])


def test_refusal_reads_only_a_json_object_with_a_string_model():
    assert SERVED.refusal(b'not json, "model"') is None  # llama-server answers that as always
    assert SERVED.refusal(b'["model"]') is None
    assert SERVED.refusal(b'{"model": 7}') is None
    assert SERVED.refusal(b'{"model": ""}') is None
    assert SERVED.refusal(b'{"messages": []}') is None
    refusal = SERVED.refusal(b'{"model": "' + b"x" * 5000 + b'"}')
    assert refusal is not None and len(refusal) < 1000  # the echoed name is cut


# --- one endpoint, several models: a request naming another fleet's model is forwarded there -------------------


def _pair(make_hop, b_settings: dict | None = None, **a_settings):
    """Hop B serves "Qwen3.6-27B"; hop A serves the 35B-A3B and routes the 27B to B (as to the shared ALB)."""
    from gguf_serve.container.hop.models import Route

    b = make_hop(models=ServedModels(("Qwen3.6-27B",)), **(b_settings or {}))
    routes = (Route("Qwen3.6-27B", f"http://127.0.0.1:{_port(b)}"),)
    a = make_hop(models=ServedModels(SERVED.names, routes), **a_settings)
    return a, b


def test_another_fleets_model_is_forwarded_there_with_the_header_its_rule_matches(make_hop, upstream):
    a, b = _pair(make_hop)
    status, doc = _post(_port(a), _chat("Qwen3.6-27B"))
    assert status == 200 and doc["choices"][0]["message"]["content"] == "abcd"
    seen = upstream.seen[-1]
    assert seen["body"]["model"] == "Qwen3.6-27B"
    assert seen["headers"]["X-Gateway-Model-Name"] == "Qwen3.6-27B"
    assert (a.metrics.routed, a.metrics.wrong_model, a.in_flight) == (1, 0, 0)  # no slot taken at A
    assert b.metrics.routed == 0 and f"{names.ROUTED} 1" in a.hop_exposition()


def test_a_stream_for_another_fleets_model_arrives_whole_through_the_forward(make_hop, upstream):
    a, _ = _pair(make_hop)
    upstream.gate.set()
    conn = http.client.HTTPConnection("127.0.0.1", _port(a), timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps({**_chat("Qwen3.6-27B"), "stream": True}), AUTH)
    answer = conn.getresponse()
    text = answer.read().decode()
    assert answer.status == 200 and text.endswith("data: [DONE]\n\n") and text.count('"content"') >= 4


def test_a_model_behind_no_fleet_is_refused_listing_every_model_behind_the_endpoint(make_hop, upstream):
    a, _ = _pair(make_hop)
    status, doc = _post(_port(a), _chat("Llama-4"))
    assert status == 404 and doc["models"] == ["Qwen3.6-35B-A3B", "qwen3.6-35b-a3b", "Qwen3.6-27B"]
    conn = http.client.HTTPConnection("127.0.0.1", _port(a), timeout=10)
    conn.request("GET", "/v1/models", headers=AUTH)
    listed = [m["id"] for m in json.loads(conn.getresponse().read())["data"]]
    assert listed == ["Qwen3.6-35B-A3B", "qwen3.6-35b-a3b", "Qwen3.6-27B"]


def test_a_request_already_named_by_the_header_is_never_forwarded_again(make_hop, upstream):
    """A misrouted rule (the header names a model this fleet does not serve) ends in a 404, not a loop."""
    a, _ = _pair(make_hop)
    conn = http.client.HTTPConnection("127.0.0.1", _port(a), timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(_chat("Qwen3.6-27B")),
                 {**AUTH, "X-Gateway-Model-Name": "Qwen3.6-27B"})  # fmt: skip
    answer = conn.getresponse()
    doc = json.loads(answer.read())
    assert answer.status == 404 and doc["models"] == list(SERVED.names)  # only what is served here
    assert a.metrics.routed == 0 and [s for s in upstream.seen if s["method"] == "POST"] == []


def test_forwards_are_bounded_and_refused_with_retry_after(make_hop, upstream):
    from gguf_serve.container.hop.limits import Limits

    a, _ = _pair(make_hop, limits=Limits(max_routed=0))
    conn = http.client.HTTPConnection("127.0.0.1", _port(a), timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(_chat("Qwen3.6-27B")), AUTH)
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 429 and answer.getheader("Retry-After") == "2"
    assert a.metrics.route_shed == 1 and a.metrics.shed == 0  # not the fleet's own shed: no scaler moves on it


def test_a_route_for_a_name_served_here_or_not_http_is_refused():
    from gguf_serve.container.hop.models import Route, parse_route

    with pytest.raises(ValueError, match="served here and routed"):
        ServedModels(("A",), (Route("A", "http://10.0.0.1:8080"),))
    with pytest.raises(ValueError, match="http://host"):
        parse_route("B=https://internal-alb:443")
    with pytest.raises(ValueError, match="NAME=http"):
        parse_route("http://10.0.0.1:8080")


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key"])
def test_a_keyless_request_for_another_fleets_model_is_401_and_never_forwarded(make_hop, upstream, authorization):
    """The forward is no way round the key: checked at the head, before the body is read or a route is looked up,
    so a keyless client cannot make one fleet's hop spend another fleet's capacity (or its forward places)."""
    from gguf_serve.container.hop.auth import ApiKeys

    keyed = {"keys": ApiKeys([KEY])}
    a, b = _pair(make_hop, keyed, **keyed)
    headers = {"Content-Type": "application/json", **({"Authorization": authorization} if authorization else {})}
    conn = http.client.HTTPConnection("127.0.0.1", _port(a), timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(_chat("Qwen3.6-27B")), headers)
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 401
    assert (a.metrics.routed, a.metrics.route_shed, a.metrics.shed, b.metrics.shed) == (0, 0, 0, 0)
    assert [s for s in upstream.seen if s["method"] == "POST"] == []
    assert _post(_port(a), _chat("Qwen3.6-27B"))[0] == 200 and a.metrics.routed == 1  # with the key: forwarded
