"""The rehearsal's forwarder (tests/rehearsal/netns.py) moves every byte both ways and passes each side's end on:
a real-size boot sends 16.8 GB through it, with splice(2) instead of a copy through Python."""

from __future__ import annotations

import random
import socket
import threading

from tests.rehearsal.netns import Forward

FLIP = bytes(b ^ 0x5A for b in range(256))  # the upstream answers each byte changed: an echo of the input fails


def _upstream() -> tuple[socket.socket, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data.translate(FLIP))
            conn.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_forward_carries_large_bodies_both_ways_and_passes_each_end_on() -> None:
    upstream, served = _upstream()
    listener = socket.create_server(("127.0.0.1", 0))
    forward = Forward(listener, upstream.getsockname()[1])
    sent = random.Random(7).randbytes(9 << 20)  # several pipe-fuls each way
    try:
        with socket.create_connection(listener.getsockname(), timeout=30) as client:
            sender = threading.Thread(target=client.sendall, args=(sent,))
            sender.start()
            got = bytearray()
            while len(got) < len(sent) and (data := client.recv(1 << 20)):
                got += data
            sender.join()
            client.shutdown(socket.SHUT_WR)
            assert client.recv(1) == b""  # the upstream's end reached the client
        assert bytes(got) == sent.translate(FLIP)
    finally:
        forward.close()
        upstream.close()
    served.join(timeout=10)
    assert not served.is_alive()  # the client's end reached the upstream
