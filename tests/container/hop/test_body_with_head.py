"""A request body that arrives with its head goes to llama-server with the head, in the same loop turn (exchange.py
`_take_buffered`); what stops such a body (over the cap, a bad chunk) is refused before any byte goes upstream, and
a body that arrives partly later is still forwarded whole."""

from __future__ import annotations

import socket
import time

from gguf_serve.container.hop.limits import Limits

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def _exchange(port: int, *pieces: bytes, pause: float = 0.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(pause)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while data := sock.recv(65536):
            answer += data
    return answer


def test_a_chunked_body_over_the_cap_that_came_with_its_head_is_413_and_never_forwarded(
    scripted, make_pooled_hop
) -> None:
    hop = make_pooled_hop(limits=Limits(max_body_bytes=10))
    body = b"14\r\n" + b"x" * 20 + b"\r\n0\r\n\r\n"
    answer = _exchange(hop.server_address[1], HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body)
    assert answer.startswith(b"HTTP/1.1 413 ")
    time.sleep(0.2)
    assert scripted.requests == []  # not even the head: llama-server never saw a request it would not get whole


def test_a_bad_chunk_that_came_with_its_head_is_400_and_never_forwarded(scripted, make_pooled_hop) -> None:
    hop = make_pooled_hop()
    answer = _exchange(hop.server_address[1], HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")
    time.sleep(0.2)
    assert scripted.requests == []


def test_a_body_partly_with_its_head_and_partly_later_is_forwarded_whole(scripted, make_pooled_hop) -> None:
    scripted.script = ["json"]
    hop = make_pooled_hop()
    body = b'{"messages": [{"role": "user", "content": "%b"}]}' % (b"y" * 3000)
    head = HEAD + b"Content-Length: %d\r\n\r\n" % len(body)
    answer = _exchange(hop.server_address[1], head + body[:1000], body[1000:], pause=0.2)
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"ab"' in answer
    assert scripted.requests == [body]
