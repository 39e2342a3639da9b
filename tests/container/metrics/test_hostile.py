"""The publishing loop against a /metrics endpoint that misbehaves on a real loopback socket: it logs one line per
failed scrape and keeps going, and it never holds more than a bounded body in memory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
THROTTLE_BPS = 200 * 1024 * 1024  # the endless body's pace: fast, but not enough to fill memory before the deadline


class RawServer:
    """Accepts connections and answers each with `mode`: truncated | not-http | trickle | endless."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                if self.mode == "truncated":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n# TYPE llamacpp:requests_processing")
                elif self.mode == "not-http":
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                elif self.mode == "trickle":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n")
                    while not self.stop.is_set():  # a byte every 0.2 s: never idle long enough for a read timeout
                        conn.sendall(b"#")
                        time.sleep(0.2)
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                    line = b"llamacpp:requests_processing 1\n" * 32768  # 1 MiB
                    while not self.stop.is_set():
                        conn.sendall(line)
                        time.sleep(len(line) / THROTTLE_BPS)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def raw_server(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    server = RawServer(request.param)
    yield server
    server.close()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.parametrize(
    ("raw_server", "reason", "timeout"),
    [
        ("truncated", "body cut short", 3),
        ("not-http", "broken HTTP answer", 3),
        ("trickle", "too slow for the 1 s deadline", 1),  # each failure takes the deadline: 1 s, not 3
        ("endless", "larger than 4 MiB", 3),
    ],
    indirect=["raw_server"],
)
def test_the_loop_survives_a_broken_metrics_endpoint(raw_server: RawServer, reason: str, timeout: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gguf_serve.container.metrics", "--url", raw_server.url, "--group", "g", "--instance-id",
         "i-0123456789abcdef0", "--slots", "2", "--interval", "1", "--timeout", str(timeout), "--dry-run"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    peak = 0.0
    try:
        deadline = time.monotonic() + 30
        while sum("scrape failed" in x for x in lines) < 3 and time.monotonic() < deadline and proc.poll() is None:
            peak = max(peak, _rss_mib(proc.pid))
            if peak >= 200:
                break  # a body read whole: stop before it takes the machine's memory
            time.sleep(0.05)
        assert proc.poll() is None, "".join(lines)  # still publishing
        failures = [x for x in lines if "scrape failed" in x]
        assert len(failures) >= 3 and all(reason in x for x in failures), "".join(lines)
        assert peak < 200, f"resident memory reached {peak:.0f} MiB"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        reader.join(timeout=5)
    assert code == 0 and "Traceback" not in "".join(lines)
    print(f"{raw_server.mode}: peak RSS {peak:.0f} MiB over {len(failures)} failed scrapes")
