"""The hop's chunked-body decoder: the same payload whatever the reads look like, and h11's strictness."""

from __future__ import annotations

import h11
import pytest

from gguf_serve.container.hop.chunked import ChunkedDecoder, ChunkedError

EVENTS = [b'data: {"choices":[{"delta":{"content":" the"}}]}\n\n', b'data: {"timings":{}}\n\n', b"data: [DONE]\n\n"]


def _framed(events: list[bytes], *, extension: bytes = b"", trailer: bytes = b"") -> bytes:
    """A body as h11 writes it (a trusted encoder), with an optional chunk extension and trailer field."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.next_event()
    conn.next_event()
    head = conn.send(h11.Response(status_code=200, headers=[("Transfer-Encoding", "chunked")]))
    body = b"".join(conn.send(h11.Data(data=e)) for e in events) + conn.send(h11.EndOfMessage())
    assert body.endswith(b"0\r\n\r\n") and head
    if extension:
        body = body.replace(b"\r\n", extension + b"\r\n", 1)
    if trailer:
        body = body[:-2] + trailer + b"\r\n"
    return body


def _decode(body: bytes, cuts: list[int]) -> tuple[bytes, bool]:
    decoder, out, last = ChunkedDecoder(), [], 0
    for cut in [*cuts, len(body)]:
        out.append(decoder.feed(body[last:cut]))
        last = cut
    return b"".join(out), decoder.done


def test_every_split_of_the_body_gives_the_same_payload_and_the_end():
    body = _framed(EVENTS, extension=b";name=value", trailer=b"x-trailer: 1\r\n")
    for cut in range(len(body) + 1):
        assert _decode(body, [cut]) == (b"".join(EVENTS), True), cut
    assert _decode(body, list(range(1, len(body)))) == (b"".join(EVENTS), True)  # a byte at a time


def test_a_read_holding_many_chunks_returns_them_joined_in_one_piece():
    decoder = ChunkedDecoder()
    assert decoder.feed(_framed(EVENTS * 10)) == b"".join(EVENTS * 10) and decoder.done


def test_an_unfinished_body_is_not_done():
    body = _framed(EVENTS)
    payload, done = _decode(body[:-2], [])
    assert payload == b"".join(EVENTS) and not done


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nab\r\n0\r\n\r\n",  # not hex
        b"\r\nab\r\n0\r\n\r\n",  # no size
        b"2\nab\r\n0\r\n\r\n",  # a bare LF
        b"2\r\nabc\r\n0\r\n\r\n",  # more data than the size said
        b"1" * 17 + b"\r\n",  # a size no file has
        b"2\r\nab\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n",  # bytes after the end (a smuggled second answer)
        b"2" + b" " * 5000 + b"\r\n",  # an endless size line
    ],
)
def test_malformed_bodies_are_refused(body):
    with pytest.raises(ChunkedError):
        ChunkedDecoder().feed(body)


def test_an_endless_line_is_refused_even_across_reads():
    decoder = ChunkedDecoder()
    with pytest.raises(ChunkedError):
        for _ in range(10):
            decoder.feed(b"a" * 1000)


def test_reads_of_one_whole_chunk_each_are_taken_whole_then_the_end():
    """llama-server's stream: every read is one token's chunk (taken as it is, framing included), then the end."""
    decoder = ChunkedDecoder()
    for event in EVENTS:
        assert decoder.one_chunk(b"%x\r\n%b\r\n" % (len(event), event)) == event and not decoder.done
    assert decoder.one_chunk(b"0\r\n\r\n") is None  # the last chunk goes through feed, which finds the end
    assert decoder.feed(b"0\r\n\r\n") == b"" and decoder.done


@pytest.mark.parametrize(
    "read",
    [
        b"3\r\nabcd\r",  # the read's length fits a whole chunk, but the data runs over its size
        b"2\r\nab\n\r",  # data of the right size, then no CRLF
        b"-2\r\nab\r\n",  # a sign int() would take: not hex digits
        b"2;x\r\nab\r\n",  # an extension: valid, but not forwarded as it came
        b"2\r\nab\r\n1\r\nc\r\n",  # two chunks
        b"2\r\na",  # half a chunk
    ],
)
def test_a_read_that_is_not_exactly_one_plain_chunk_is_left_to_feed(read):
    decoder = ChunkedDecoder()
    assert decoder.one_chunk(read) is None
    assert decoder.one_chunk(b"2\r\nab\r\n") == b"ab"  # nothing was consumed


def test_a_whole_chunk_is_not_taken_in_the_middle_of_another():
    decoder = ChunkedDecoder()
    assert decoder.feed(b"5\r\nab") == b"ab"
    assert decoder.one_chunk(b"2\r\nab\r\n") is None  # these are the chunk's last 3 bytes and more
    assert decoder.feed(b"cde\r\n") == b"cde"
    assert decoder.one_chunk(b"2\r\nab\r\n") == b"ab"
