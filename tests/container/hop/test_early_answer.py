"""llama-server answers a request before it has read the body (a 401 for a keyless one) and closes with the rest
unread, so its kernel resets the connection: the hop's next write of the body fails, and the client should still
get llama-server's answer, not a 502.

asyncio's transports (and uvloop's) close on a failed write without reading what the kernel still holds, though
Linux keeps what came before a reset readable: before upstream.py read it from a second descriptor, the hop answered
502 "llama-server closed the connection without an answer" here every time, and in the keyless chaos test on a
loaded machine in some runs.
"""

from __future__ import annotations

import socket
import threading

MIB = 1024 * 1024
ANSWER = b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}'


def _answer_early_and_reset(listener: socket.socket, read_first: int) -> None:
    """An upstream that reads the head and `read_first` bytes of the body, answers 401 and closes with the rest
    unread, so that its kernel resets the connection (what cpp-httplib does to a keyless body it will not read)."""
    conn, _ = listener.accept()
    with conn:
        seen = b""
        while b"\r\n\r\n" not in seen:
            seen += conn.recv(65536)
        while len(seen) < read_first:
            seen += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json; charset=utf-8\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(ANSWER), ANSWER))  # fmt: skip


def _status_of_a_big_keyless_body(port: int, size: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % size)  # fmt: skip
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(_read_until_closed(client)))
        reader.start()
        sent, piece = 0, b"x" * MIB
        try:
            while sent < size and not got:
                client.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # the hop closed after its answer: what it answered is what the reader has
        reader.join(10)
    return bytes(got)


def _read_until_closed(sock: socket.socket) -> bytes:
    out = b""
    try:
        while data := sock.recv(65536):
            out += data
            if b"\r\n\r\n" in out:
                break
    except OSError:
        pass
    return out


def test_an_answer_before_the_body_reaches_the_client_when_llama_server_closes(make_hop) -> None:
    for _ in range(5):  # the race between the hop's write and llama-server's reset, five times
        with socket.create_server(("127.0.0.1", 0)) as listener:
            upstream = threading.Thread(target=_answer_early_and_reset, args=(listener, 256 * 1024), daemon=True)
            upstream.start()
            hop = make_hop(f"http://127.0.0.1:{listener.getsockname()[1]}")
            head = _status_of_a_big_keyless_body(hop.server_address[1], 24 * MIB)
            upstream.join(10)
        assert head.startswith(b"HTTP/1.1 401 "), head[:200]
