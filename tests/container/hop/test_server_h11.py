"""ServerH11 (server_h11.py) against h11's own server side: for every answer shape the hop sends, the same bytes on
the wire and the same states after, on the short path and off it."""

from __future__ import annotations

import h11
import pytest

from gguf_serve.container.hop.server_h11 import ServerH11

LIMIT = 16384
BODY = b"data: {}\n\n"
SSE = [(b"Content-Type", b"text/event-stream"), (b"Access-Control-Allow-Origin", b"*"), (b"Server", b"llama.cpp")]


def _request(method: bytes, version: bytes, extra: bytes = b"") -> bytes:
    body = b"{}" if method == b"POST" else b""
    length = b"Content-Length: %d\r\n" % len(body) if body else b""
    return b"%b /v1/chat/completions HTTP/%b\r\nHost: x\r\n%b%b\r\n%b" % (method, version, length, extra, body)


def _exchange(conn: h11.Connection, request: bytes, response: h11.Response) -> tuple[bytes, list]:
    conn.receive_data(request)
    while conn.next_event() is not h11.NEED_DATA and conn.their_state is not h11.DONE:
        pass
    wire = conn.send(response) or b""
    states = [conn.our_state, conn.their_state]
    try:  # a body where the answer may have none (HEAD, 204, 304) is refused: by both alike
        wire += b"".join(conn.send(e) or b"" for e in (h11.Data(data=BODY), h11.EndOfMessage()))
    except h11.LocalProtocolError as e:
        wire += str(e).encode()
    return wire, [*states, conn.our_state, conn.their_state]


@pytest.mark.parametrize(
    ("method", "version", "extra"),
    [(b"POST", b"1.1", b""), (b"GET", b"1.1", b""), (b"POST", b"1.0", b""), (b"HEAD", b"1.1", b""),
     (b"POST", b"1.1", b"Connection: close\r\n"), (b"POST", b"1.0", b"Connection: keep-alive\r\n")],
)  # fmt: skip
@pytest.mark.parametrize(
    ("status", "headers"),
    [(200, SSE), (200, [*SSE, (b"Content-Length", b"%d" % len(BODY))]),
     (200, [*SSE, (b"Transfer-Encoding", b"chunked")]), (200, [*SSE, (b"Connection", b"close")]),
     (201, []), (204, SSE), (304, []), (401, [(b"X-A", b"b")])],
)  # fmt: skip
def test_the_same_bytes_and_states_as_h11(method, version, extra, status, headers) -> None:
    def response(parsed: bool) -> h11.Response:
        return h11.Response(status_code=status, headers=headers, reason=b"OK", _parsed=parsed)

    for parsed in (True, False):
        ours = _exchange(ServerH11(max_incomplete_event_size=LIMIT), _request(method, version, extra), response(parsed))
        theirs = _exchange(h11.Connection(h11.SERVER, max_incomplete_event_size=LIMIT),
                           _request(method, version, extra), response(parsed))  # fmt: skip
        assert ours == theirs


def test_the_short_path_is_taken_for_a_streamed_answer(monkeypatch) -> None:
    """The SSE answer to a keep-alive HTTP/1.1 request is framed without h11's cleanup (which would validate its
    fields three more times), chunked, and the connection stays open for the next request."""
    monkeypatch.setattr(h11.Connection, "_clean_up_response_headers_for_sending", _fail)
    conn = ServerH11(max_incomplete_event_size=LIMIT)
    wire, states = _exchange(conn, _request(b"POST", b"1.1"), h11.Response(status_code=200, headers=SSE))
    assert wire.startswith(b"HTTP/1.1 200 \r\nContent-Type: text/event-stream\r\n")
    assert b"\r\nTransfer-Encoding: chunked\r\n\r\n" in wire and wire.endswith(b"\r\n0\r\n\r\n")
    assert states == [h11.SEND_BODY, h11.DONE, h11.DONE, h11.DONE]
    conn.start_next_cycle()


def _fail(self, response):
    raise AssertionError("h11's own cleanup ran")
