"""A scripted stand-in for llama-server over raw sockets: HTTP/1.1 keep-alive framed as cpp-httplib frames it, each
request answered as the script says, its accepts counted."""

from __future__ import annotations

import json
import socket
import threading
import time

from .events import TIMINGS, chat_chunk, sse

BIG_EVENTS = 2048  # 32 MiB: more than every socket buffer on the way can hold
ANSWER = [sse(chat_chunk("a")), sse(chat_chunk("b")), sse({**chat_chunk(None), "timings": TIMINGS}), sse("[DONE]")]


class ScriptedUpstream:
    """HTTP/1.1 keep-alive like cpp-httplib. Each request takes the next step of `script`:
    "sse" a whole streamed answer; "paced" the same, a chunk every 20 ms (one read each, as llama-server's tokens
    come); "json" a whole Content-Length answer; "close" a whole streamed answer with
    `Connection: close` (the connection left open: the hop must close it); "cut" the answer's head and one chunk,
    then the close; "hang" the head and one chunk, then nothing until the hop closes the connection; "drop" the
    request read and the connection closed without a byte (a kept connection closed as the request came).
    Streamed, with the head and every chunk written as the step says: "together" the whole answer in one write;
    "split" the body in 7-byte writes; "trailing" a whole answer followed by bytes that are not part of it; "big"
    BIG_EVENTS events of 16 KiB of text each (`sent` counts the bytes llama-server's socket took)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.accepts = 0
        self.requests: list[bytes] = []
        self.open: list[socket.socket] = []
        self.closed_by_hop = threading.Event()  # a "close", "hang" or "big" connection that the hop closed
        self.sent = 0  # bytes of the "big" answer written so far
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepts += 1
            self.open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as rfile:
            while head := self._head(rfile):
                length = next((int(v) for n, v in head if n == b"content-length"), 0)
                self.requests.append(rfile.read(length))
                step = self.script.pop(0) if self.script else "sse"
                if step == "drop":
                    return
                if step == "json":
                    body = json.dumps({"choices": [{"message": {"content": "ab"}}], "timings": TIMINGS}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5, "
                                 b"max=100\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
                    continue
                close = b"Connection: close\r\n" if step == "close" else b"Keep-Alive: timeout=5, max=100\r\n"
                head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + close
                        + b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
                if step in ("together", "split", "trailing", "big"):
                    if not self._stream(conn, step, head):
                        return
                    continue
                try:
                    conn.sendall(head)
                    for piece in ANSWER if step in ("sse", "close", "paced") else ANSWER[:1]:
                        if step == "paced":
                            time.sleep(0.02)
                        conn.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
                except OSError:  # the hop closed it before the answer was out (its client had left already)
                    if step in ("close", "hang"):
                        self.closed_by_hop.set()
                    return
                if step == "cut":
                    return
                if step != "hang":
                    conn.sendall(b"0\r\n\r\n")
                if step in ("close", "hang"):
                    conn.settimeout(5)
                    try:
                        closed = rfile.read(1) == b""
                    except ConnectionResetError:  # closed with our chunk unread in its buffer: the kernel sends RST
                        closed = True
                    if closed:
                        self.closed_by_hop.set()
                    return

    def _stream(self, conn: socket.socket, step: str, head: bytes) -> bool:
        """A whole streamed answer written as `step` says; False when the connection is done with."""
        body = b"".join(b"%x\r\n%b\r\n" % (len(piece), piece) for piece in ANSWER) + b"0\r\n\r\n"
        if step == "together":
            conn.sendall(head + body)
        elif step == "trailing":
            conn.sendall(head + body + b"HTTP/1.1 200 OK\r\n")
        elif step == "split":
            conn.sendall(head)
            for i in range(0, len(body), 7):
                conn.sendall(body[i : i + 7])
                time.sleep(0.002)  # each piece a read of its own
        else:
            event = sse(chat_chunk("x" * 16384))
            try:
                conn.sendall(head)
                chunk = b"%x\r\n%b\r\n" % (len(event), event)
                for _ in range(BIG_EVENTS):
                    conn.sendall(chunk)
                    self.sent += len(chunk)
                conn.sendall(b"%x\r\n%b\r\n0\r\n\r\n" % (len(ANSWER[-1]), ANSWER[-1]))
            except OSError:
                self.closed_by_hop.set()
                return False
        return True

    @staticmethod
    def _head(rfile) -> list[tuple[bytes, bytes]] | None:
        if not rfile.readline():
            return None
        fields = []
        while (line := rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            fields.append((name.strip().lower(), value.strip()))
        return fields

    def close_idle(self) -> None:
        """llama-server's keep-alive timeout: every connection it holds is closed."""
        for conn in self.open:
            conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()
