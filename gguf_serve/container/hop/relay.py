"""llama-server's answer back to the client, timed: the head and whole answers through h11, and a streamed (SSE)
answer that is chunked both ways relayed from the upstream socket's read callback.

On that streaming path (`StreamRelay`) one read of llama-server's socket is one call: the bytes are decoded in one
pass (chunked.py), their tokens timed (metrics.py), and the payload written to the client's transport as one chunk,
with no future, task step or buffer copy between the two sockets. When the client's buffer passes its high-water
mark, reading llama-server pauses until the client takes the bytes (within the send timeout), as a send that
waited would. At the answer's end the connection goes back to being read by calls (`UpstreamConnection.read`),
and only then back to the pool.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import h11

from gguf_serve.container.hop.answer import AnswerReader
from gguf_serve.container.hop.chunked import HEX_DIGITS, ChunkedDecoder
from gguf_serve.container.hop.client import HOP_BY_HOP, ClientConnection, ClientGone, Hop, fields
from gguf_serve.container.hop.metrics import RequestRecord, SseTokenScanner
from gguf_serve.container.hop.upstream import UpstreamConnection

_monotonic = time.monotonic
MAX_KEPT_BODY = 8 * 1024 * 1024  # a non-streamed answer is read for its timings up to this size
MAX_METRICS_BODY = 16 * 1024 * 1024
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Answer:
    """The answer's half of an exchange (exchange.Exchange): what it reads of the request and what it records."""

    conn: ClientConnection
    server: Hop
    request: h11.Request
    route: str
    record: RequestRecord | None
    up: AnswerReader  # llama-server's answer to this exchange
    head_sent: bool  # the answer's head went to the client: an error now cuts the answer, it is no 502
    completed: bool  # the whole answer reached the client
    keep_alive: bool  # llama-server's answer leaves the connection open (HTTP/1.1, no Connection: close)
    answer_read: bool  # and it was read to its end
    last_byte: float  # time.monotonic() of llama-server's last byte: the silence timer reads it
    _resend: list[bytes] | None

    async def read_upstream(self, upstream: UpstreamConnection) -> bytes:
        """The next bytes from llama-server (b"" at its end); the relay's watcher stops a silent one."""
        data = await upstream.read()
        if data:
            self.last_byte = self.server.last_upstream_byte = time.monotonic()
            self._resend = None  # an answer under way: the request is never sent twice
        return data

    async def relay_answer(self, upstream: UpstreamConnection) -> None:
        """llama-server's answer to this request back to the client, timed."""
        conn, up, server, record = self.conn, self.up, self.server, self.record
        metrics_route = self.request.method == b"GET" and self.route == "/metrics"
        scanner: SseTokenScanner | None = None
        kept: bytearray | None = None
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                up.receive_data(await self.read_upstream(upstream))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                lowered = fields(event.headers)
                self.keep_alive = _keeps_alive(event, lowered)
                if metrics_route:
                    await self._metrics(event, upstream)
                    return
                headers = [(n, v) for n, v in event.headers.raw_items() if n.lower() not in HOP_BY_HOP]
                if record is not None:
                    record.status = event.status_code
                    ctype = dict(lowered).get(b"content-type", b"")
                    record.stream = bool(ctype) and ctype.startswith(b"text/event-stream")
                    scanner = SseTokenScanner(record) if record.stream else None
                    kept = bytearray() if not record.stream and event.status_code == 200 else None
                if conn.h11.their_state is h11.SEND_BODY:  # answered before the body is in: a refusal; then close
                    headers.append((b"connection", b"close"))
                # _parsed: the fields were checked where they were read (answer.py or h11), not once more
                answer = h11.Response(status_code=event.status_code, headers=headers, reason=event.reason, _parsed=True)
                await conn.send(answer)
                self.head_sent = True
                if scanner is not None and self._chunked_both_ways(event, lowered):
                    await self._stream(upstream, scanner, up.trailing_data[0])
                    return
            elif isinstance(event, h11.Data):
                if scanner is not None:
                    scanner.feed(event.data, time.monotonic())
                elif kept is not None and len(kept) + len(event.data) <= MAX_KEPT_BODY:
                    kept += event.data
                await conn.send(h11.Data(data=event.data))
                if scanner is not None and scanner.done and record is not None:
                    record.answered = True
            elif isinstance(event, h11.EndOfMessage):
                self.answer_read = not up.trailing_data[0]  # llama-server sends nothing after its answer
                if record is not None:
                    record.finished = time.monotonic()
                    if kept is not None:
                        record.timings = _timings(bytes(kept))
                # llama-server may answer before the body is in: then the client's h11 is not DONE and run() closes
                await conn.send(h11.EndOfMessage())
                self.completed = True
                if record is not None:
                    server.metrics.observe(record)
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("upstream closed")

    def _chunked_both_ways(self, response: h11.Response, lowered: list[tuple[bytes, bytes]]) -> bool:
        """llama-server sends the answer chunked, and h11 frames it chunked for this client (HTTP/1.1, a body)."""
        upstream = any(name == b"transfer-encoding" for name, _ in lowered)
        client = self.conn.h11.their_http_version == b"1.1" and not self.conn.head_only
        return upstream and client and response.status_code not in (204, 304)

    async def _stream(self, upstream: UpstreamConnection, scanner: SseTokenScanner, buffered: bytes) -> None:
        """An SSE answer, chunked both ways, relayed by StreamRelay from the read callback; this task only waits for
        its end, or for the client to take its bytes when it falls behind. The hop's cost per token."""
        transport = self.conn.transport
        low, high = transport.get_write_buffer_limits()
        relay = StreamRelay(self, upstream, scanner, high)
        # uvloop writes at once only what takes the buffer over its high-water mark and queues the rest for the end
        # of the loop's turn (2,000 more instructions per token): with no mark, each token goes out from the read
        # callback, as asyncio's own transport sends it. The relay pauses llama-server at the client's real mark.
        transport.set_write_buffer_limits(high=0)
        try:
            upstream.relay(relay, buffered)
            while True:
                await relay.wake
                if relay.error is not None:
                    raise relay.error
                if relay.done:
                    break
                await self.conn.drain()  # over the client's high-water mark: reading llama-server waits for this
                if relay.error is not None:
                    raise relay.error
                relay.wake = asyncio.get_running_loop().create_future()
                upstream.resume_reading()
        finally:
            upstream.unrelay()
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=high, low=low)
        if transport.get_write_buffer_size() > high:
            await self.conn.drain()  # the last chunk counts as sent once the client took it, as every other write
        record = scanner.record
        record.answered = record.answered or scanner.done
        self.completed = True
        self.server.metrics.observe(record)

    async def _metrics(self, response: h11.Response, upstream: UpstreamConnection) -> None:
        up, conn = self.up, self.conn
        parts = bytearray()
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                up.receive_data(await self.read_upstream(upstream))
            elif isinstance(event, h11.Data):
                parts += event.data
                if len(parts) > MAX_METRICS_BODY:
                    raise h11.RemoteProtocolError("upstream /metrics too large")
            elif isinstance(event, h11.EndOfMessage):
                self.answer_read = not up.trailing_data[0]
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("upstream closed")
        headers = list(response.headers.raw_items())
        payload = bytes(parts)
        if response.status_code == 200:  # 401 without the key, 503 while loading: llama-server's answer as it is
            hop = await asyncio.to_thread(self.server.hop_exposition)  # nvidia-smi may take a while
            payload = payload.rstrip(b"\n") + b"\n" + hop.encode()
            if not any(n.lower() == b"content-type" for n, _ in headers):
                headers.append((b"Content-Type", METRICS_CONTENT_TYPE.encode()))
        self.head_sent = True  # from here an error cannot become a 502 cleanly
        await conn.relay_whole(response.status_code, headers, payload)


class StreamRelay:
    """The sink for one streamed answer (upstream.Sink). `wake` completes when the answer went whole to the client
    (`done`), broke (`error`), or the client fell behind (reading is paused; the task waits for the client)."""

    __slots__ = ("client", "decoder", "done", "error", "ex", "h11", "high", "record", "scanner", "server", "upstream",
                 "wake")  # fmt: skip

    def __init__(self, ex: Answer, upstream: UpstreamConnection, scanner: SseTokenScanner, high: int) -> None:
        self.ex, self.server, self.upstream = ex, ex.server, upstream
        self.scanner, self.record = scanner, scanner.record
        self.client = ex.conn.transport
        self.h11 = ex.conn.h11
        self.high = high  # the client's high-water mark: over it, reading llama-server pauses
        self.decoder = ChunkedDecoder()
        self.wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.done = False
        self.error: BaseException | None = None

    def feed(self, data: bytes) -> None:
        now = _monotonic()
        self.ex.last_byte = self.server.last_upstream_byte = now  # the silence timer reads it
        try:
            # The read llama-server's stream is made of: one token's chunk holding one whole event (`data: {...}`
            # and the empty line), between chunks and events. Checked with calls that take one argument (no
            # argument tuple to build and parse) and sent on as it came, framing included.
            size, crlf, rest = data.partition(b"\r\n")
            line, _, tail = rest.partition(b"\n")
            if (
                tail == b"\n\r\n"
                and line[:5] == b"data:"
                and self.decoder.between
                and self.scanner.between
                and 0 < len(size) <= 16
                and HEX_DIGITS.issuperset(size)
                and int(size, 16) == len(line) + 2
            ):
                self.scanner.event(line[5:].strip(), now)
                frame = data
            else:
                frame = self._frame(data, now)
                if frame is None:
                    return
            client = self.client
            if client.is_closing():
                raise ClientGone("the client connection closed")
            if frame:
                client.write(frame)
                if self.scanner.done:
                    self.record.answered = True  # a client may leave at [DONE], before the body's end
            if client.get_write_buffer_size() > self.high:
                self.upstream.pause_reading()  # resumed by _stream once the client took the bytes
                self._wake()
        except Exception as e:  # a bad chunk, the client gone: never into the transport's read callback
            self.ended(e)

    def _frame(self, data: bytes, now: float) -> bytes | None:
        """Any other read: its payload decoded, scanned and framed as one chunk (None once the answer ended)."""
        payload = self.decoder.one_chunk(data)
        if payload is not None:
            frame = data  # one whole chunk: it goes to the client as it came
        else:
            payload = self.decoder.feed(data)
            if self.decoder.done:
                if payload:
                    self.scanner.feed(payload, now)
                self._finish(payload, now)
                return None
            frame = b"%x\r\n%b\r\n" % (len(payload), payload) if payload else b""
        if payload:
            self.scanner.feed(payload, now)
        return frame

    def ended(self, error: BaseException | None) -> None:
        if self.error is None and not self.done:
            self.error = error or h11.RemoteProtocolError("upstream closed in the middle of the answer")
        self.upstream.unrelay()
        self._wake()

    def _finish(self, payload: bytes, now: float) -> None:
        """The answer's end: back to reading by calls (the connection may go back to the pool), the last payload
        and the end of the client's answer in one write."""
        self.upstream.unrelay()
        self.ex.answer_read = True  # read whole: the connection may go back to the pool even if the client left
        self.record.finished = now
        if self.client.is_closing():
            raise ClientGone("the client connection closed")
        chunk = b"%x\r\n%b\r\n" % (len(payload), payload) if payload else b""
        self.client.write(chunk + (self.h11.send(h11.EndOfMessage()) or b""))
        self.done = True
        self._wake()

    def _wake(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)


def _keeps_alive(response: h11.Response, lowered: list[tuple[bytes, bytes]]) -> bool:
    """HTTP/1.1 without `Connection: close`: llama-server keeps the connection for another request."""
    if response.http_version != b"1.1":
        return False
    return not any(name == b"connection" and value.lower().find(b"close") != -1 for name, value in lowered)


def _timings(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    timings = doc.get("timings") if isinstance(doc, dict) else None
    return timings if isinstance(timings, dict) else None
