"""The request framing and answer reading that stand in for h11 on llama-server's side (answer.py): the same bytes and
events as h11 on the shapes llama-server writes, and h11's own outcome (events or refusal) on every other shape."""

from __future__ import annotations

import h11
import pytest

from gguf_serve.container.hop.answer import LAST_CHUNK, AnswerReader, frame_chunk, frame_request

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: \r\nContent-Type: text/event-stream\r\n"
    b"Keep-Alive: timeout=5, max=100\r\nServer: llama.cpp\r\nTransfer-Encoding: chunked\r\n\r\n"
)
SSE_BODY = b'18\r\ndata: {"content":"hi"}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n'
JSON = b'{"choices":[],"timings":{"predicted_n":1}}'
JSON_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(JSON), JSON)


def _events(conn, pieces: list[bytes]) -> list:
    """What a reader gives for these reads (b"" is the close), Data joined: comparable between h11 and ours."""
    out: list = []
    pieces = list(pieces)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if not pieces:
                    out.append("need-data")
                    break
                conn.receive_data(pieces.pop(0))
            elif isinstance(event, h11.Response | h11.InformationalResponse):
                out.append((type(event).__name__, event.status_code, list(event.headers.raw_items()), event.reason))
            elif isinstance(event, h11.Data):
                if out and isinstance(out[-1], bytes):
                    out[-1] += event.data
                else:
                    out.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                out.append("end")
                break
            else:
                out.append(type(event).__name__)
                break
    except h11.RemoteProtocolError:
        return [*out, "refused"]  # what stays buffered after a refusal is never read
    return [*out, conn.trailing_data[0]]


def _h11(method: bytes) -> h11.Connection:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=65536)
    conn.send(h11.Request(method=method, target=b"/", headers=[(b"host", b"x")]))
    conn.send(h11.EndOfMessage())
    return conn


def _both(data: bytes, *, method: bytes = b"POST", split: int | None = None, close: bool = False):
    pieces = [data] if split is None else [data[i : i + split] for i in range(0, len(data), split)]
    pieces += [b""] if close else []
    return _events(AnswerReader(method, limit=65536), pieces), _events(_h11(method), pieces)


@pytest.mark.parametrize("answer", [SSE_HEAD + SSE_BODY, JSON_ANSWER], ids=["sse-chunked", "json-length"])
@pytest.mark.parametrize("split", [None, 1, 7])
def test_llama_server_answers_read_as_h11_reads_them(answer: bytes, split: int | None) -> None:
    ours, theirs = _both(answer, split=split)
    assert ours == theirs
    assert ours[-2] == "end" and ours[0][1] == 200


def test_the_fast_path_takes_llama_server_heads_without_h11() -> None:
    for answer in (SSE_HEAD + SSE_BODY, JSON_ANSWER):
        reader = AnswerReader(b"POST", limit=65536)
        reader.receive_data(answer)
        assert isinstance(reader.next_event(), h11.Response)
        assert reader._h11 is None  # parsed here, not handed to h11


def test_bytes_after_the_answer_are_trailing_data_as_in_h11() -> None:
    for answer in (SSE_HEAD + SSE_BODY, JSON_ANSWER):
        ours, theirs = _both(answer + b"HTTP/1.1 200")
        assert ours == theirs and ours[-1] == b"HTTP/1.1 200"


ODD = {
    "no-framing-body-to-close": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it",
    "informational-first": b"HTTP/1.1 100 Continue\r\n\r\n" + JSON_ANSWER,
    "no-content": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    "http-1.0": b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "no-reason": b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
    "obs-fold": b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  2\r\nContent-Length: 2\r\n\r\nok",
    "bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    "lf-crlf-end": b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok",
    "length-and-chunked": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nok\r\n0\r\n\r\n",
    "two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
    "unequal-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    "gzip-coding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok",
    "space-before-colon": b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
    "control-in-value": b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\nok",
    "bad-status": b"HTTP/1.1 20x OK\r\nContent-Length: 2\r\n\r\nok",
    "bad-length": b"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\nok",
    "bad-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
    "not-http": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_any_other_answer_gets_h11s_own_outcome(name: str) -> None:
    ours, theirs = _both(ODD[name], close=True)
    assert ours == theirs


def test_a_head_request_is_framed_by_h11() -> None:
    ours, theirs = _both(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", method=b"HEAD", close=True)
    assert ours == theirs and ours[-2] == "end"


@pytest.mark.parametrize("cut", [0, 10, -40, -3])
def test_a_close_before_the_end_is_refused_as_in_h11(cut: int) -> None:
    for answer in (SSE_HEAD + SSE_BODY, JSON_ANSWER):
        ours, theirs = _both(answer[:cut], close=True)
        assert ours == theirs and "refused" in ours


def test_a_head_over_the_limit_is_refused_as_in_h11() -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: %b\r\n" % (b"a" * 70000)
    reader = AnswerReader(b"POST", limit=65536)
    assert _events(reader, [head])[0] == _events(_h11(b"POST"), [head])[0] == "refused"


def test_requests_are_framed_as_h11_frames_them() -> None:
    headers = [(b"Host", b"127.0.0.1:8080"), (b"Content-Type", b"application/json"), (b"Content-Length", b"2")]
    up = h11.Connection(h11.CLIENT)
    expected = up.send(h11.Request(method=b"POST", target=b"/v1/chat/completions?x=1", headers=headers))
    assert frame_request(b"POST", b"/v1/chat/completions?x=1", headers) == expected
    assert frame_request(b"POST", b"/v1/chat/completions?x=1", [headers[1], headers[0], headers[2]]) == expected
    chunked = [(b"Host", b"h"), (b"Transfer-Encoding", b"chunked")]
    up = h11.Connection(h11.CLIENT)
    framed = up.send(h11.Request(method=b"POST", target=b"/completion", headers=chunked))
    assert frame_request(b"POST", b"/completion", chunked) == framed
    body = [up.send(h11.Data(data=b"abc")), up.send(h11.Data(data=b"x" * 300)), up.send(h11.EndOfMessage())]
    assert [frame_chunk(b"abc"), frame_chunk(b"x" * 300), LAST_CHUNK] == body
    assert frame_chunk(b"") == b""
