"""The floor instrument of tests/benchmarks/hop_cpu.py (`--relay floor`): the C byte relay compiles without a
warning, as the benchmark compiles it, and carries bytes through whole, both ways, for each of several connections."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from tests.benchmarks import hop_cpu


def _echo_upper(listener: socket.socket, connections: int) -> None:
    """Answers each connection's bytes upper-cased, until that client closes."""
    for _ in range(connections):
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())


def test_the_floor_relay_carries_bytes_both_ways(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        threading.Thread(target=_echo_upper, args=(listener, 3), daemon=True).start()
        relay, port = hop_cpu.start([*hop_cpu.floor_relay(tmp_path), str(listener.getsockname()[1])])
        try:
            for n in range(3):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                    sent = b"token %d " % n * 20_000  # more than one read: the relay loops
                    client.sendall(sent)
                    got = b""
                    while len(got) < len(sent):
                        got += client.recv(65536)
                    assert got == sent.upper()
        finally:
            relay.terminate()
            relay.wait(10)
