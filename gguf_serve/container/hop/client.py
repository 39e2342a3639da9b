"""The hop's side facing a client: one connection's requests read one after another with h11, and the answers the
hop writes itself (refusals, /health, /metrics) or relays whole.

h11 (RFC 9112, pure Python) frames requests; on top of it the hop refuses what would be ambiguous to forward
(Content-Length with Transfer-Encoding, repeated Content-Length) and bounds what a client can hold: header, body
and idle timeouts, a body cap answered with 413, and a send timeout for a client that stops reading. What to do
with a request is the server's (`ProxyServer.handle`, admission.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Iterable
from typing import Any, Protocol

import h11

from gguf_serve.container.hop.auth import ApiKeys
from gguf_serve.container.hop.channel import Channel
from gguf_serve.container.hop.connections import BUSY, IDLE
from gguf_serve.container.hop.drain import DrainState
from gguf_serve.container.hop.limits import Admission, Limits
from gguf_serve.container.hop.metrics import RequestMetrics
from gguf_serve.container.hop.models import ServedModels
from gguf_serve.container.hop.server_h11 import ServerH11
from gguf_serve.container.hop.upstream import UpstreamPool

log = logging.getLogger("gguf-serve-hop")

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"trailers",
     b"transfer-encoding", b"upgrade", b"host", b"expect", b"proxy-connection"}
)  # fmt: skip
READ_SIZE = 65536
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # where h11 ends a request head (it accepts bare LF line ends too)
_LENGTH_FIELD = re.compile(rb"\ncontent-length:", re.IGNORECASE)  # at a field line's start (no space before :)


def fields(headers: Any) -> list[tuple[bytes, bytes]]:
    """(lower-case name, value) of each field of h11 Headers, in one list: iterating Headers costs a call per field."""
    return [(name.lower(), value) for name, value in headers.raw_items()]


def error_body(status: int, message: str, kind: str, code: str | None = None) -> bytes:
    """llama-server's error shape, which is OpenAI's ({"error": {"message", "type", "code"}})."""
    return json.dumps({"error": {"code": code or status, "message": message, "type": kind, "param": None}}).encode()


class Hop(Protocol):
    """What a client connection and its requests use of the hop (proxy.ProxyServer)."""

    limits: Limits
    admission: Admission
    metrics: RequestMetrics
    upstream: UpstreamPool
    upstream_netloc: str
    upstream_timeout_s: float
    keys: ApiKeys | None
    models: ServedModels | None
    routes: dict[str, Any]  # model -> exchange.Via
    routed_in_flight: int
    drain: DrainState | None
    in_flight: int
    last_upstream_byte: float

    def rewrite(self, request: h11.Request) -> h11.Request: ...

    async def handle(self, conn: ClientConnection, request: h11.Request) -> None: ...

    def place(self, conn: ClientConnection, where: str) -> None: ...

    def hop_exposition(self) -> str: ...


class ClientGone(Exception):
    """The client closed, reset or stopped reading."""


class Refused(Exception):
    """A request the hop answers itself with an error, never forwarded."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ClientConnection:
    """One client connection: requests one after another (h11 keeps pipelined bytes until the cycle ends)."""

    def __init__(self, server: Hop, channel: Channel) -> None:
        self.server = server
        self.limits = server.limits
        self.channel = channel
        self.transport = channel.transport
        self.h11 = ServerH11(max_incomplete_event_size=server.limits.max_header_bytes)
        self.overflow = False  # let in past a full table: answers GET /health only, then closes
        self.task: asyncio.Task[Any] | None = None
        self.peer_eof = False
        self.head_only = False  # the current request is HEAD: answers carry no body

    def place(self, where: str) -> None:
        self.server.place(self, where)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.transport.abort()

    async def run(self) -> None:
        try:
            while True:
                self.place(IDLE)
                try:
                    event = await self._next_request()
                except h11.RemoteProtocolError as e:
                    await self.refuse(e.error_status_hint, f"bad request: {e}")
                    return
                if not isinstance(event, h11.Request):
                    return
                self.place(BUSY)
                await self.server.handle(self, event)
                if self.h11.our_state is h11.DONE and self.h11.their_state is h11.SEND_BODY:
                    self.take_buffered_body()  # answered before its body arrived: kept only if the body is in
                if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE or self.overflow:
                    return
                self.h11.start_next_cycle()
        except (ClientGone, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except h11.LocalProtocolError as e:
            log.warning("connection ended: %s", e)
        finally:
            if self.h11.our_state is h11.ERROR:
                self.transport.abort()
            else:
                if self.h11.their_state not in (h11.DONE, h11.IDLE, h11.CLOSED) and not self.peer_eof:
                    await self._linger()
                self.transport.close()

    async def _linger(self, seconds: float = 2.0) -> None:
        """After an answer to a request whose body is still arriving (401 from llama-server, 413, 429, 408):
        half-close and drop what comes for a moment, so that the client reads the answer before the close resets
        the connection. A client writing its body as fast as loopback takes it sends megabytes before it looks
        for an answer: the hop drops up to a whole body's worth (`max_body_bytes`) within the time, as nginx's
        lingering close does (by time alone); with a 4 MiB bound here one keyless 24 MiB body in a few was reset
        before its client read the 401."""
        end, dropped, most = time.monotonic() + seconds, 0, self.limits.max_body_bytes
        with contextlib.suppress(Exception):
            self.transport.write_eof()
            while dropped < most and (left := end - time.monotonic()) > 0:
                data = await self.channel.read(READ_SIZE, left)  # TimeoutError: the linger is over
                if not data:
                    return
                dropped += len(data)

    async def receive(self, timeout: float, size: int = READ_SIZE) -> None:
        """Feed h11 the next bytes (TimeoutError when none came in time). What arrives after a timeout or a
        cancelled caller stays in the channel for the next call."""
        try:
            data = await self.channel.read(size, timeout)
        except TimeoutError:
            raise
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from None
        if not data:
            self.peer_eof = True
        self.h11.receive_data(data)

    async def _next_request(self) -> h11.Request | h11.ConnectionClosed:
        """The next request head: idle_timeout_s for its first byte, then header_timeout_s for all of it."""
        deadline = time.monotonic() + self.limits.header_timeout_s if self.overflow else None
        while True:
            if self.h11.their_state is h11.IDLE and _repeated_length(self.h11.trailing_data[0]):
                await self._refuse_unparsed(400, "bad request: more than one Content-Length")
                raise ClientGone("repeated Content-Length")
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if deadline is None and self.h11.trailing_data[0]:
                    deadline = time.monotonic() + self.limits.header_timeout_s
                wait = self.limits.idle_timeout_s if deadline is None else deadline - time.monotonic()
                if wait <= 0:
                    await self.refuse(408, "request headers not complete in time")
                    raise ClientGone("header timeout")
                # h11 checks its limit on incomplete heads only: never read past it, so that a bigger head is one
                room = self.limits.max_header_bytes + 1 - len(self.h11.trailing_data[0])
                try:
                    await self.receive(wait, size=max(1, room))
                except TimeoutError:
                    if deadline is not None:
                        await self.refuse(408, "request headers not complete in time")
                    raise ClientGone("timeout") from None
                continue
            if isinstance(event, h11.Request | h11.ConnectionClosed):
                return event
            raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}", error_status_hint=400)

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.write(data)

    async def write(self, data: bytes) -> None:
        """Bytes to the client; waits (at most send_timeout_s) only while its buffer is over the high-water mark:
        a drain wrapped in wait_for on every token cost a task and a timer each."""
        transport = self.transport
        if transport.is_closing():
            raise ClientGone("the client connection closed")
        transport.write(data)
        if transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]:
            await self.drain()

    async def drain(self) -> None:
        """Wait until the client takes what is buffered for it: at most send_timeout_s, then it is gone."""
        try:
            await asyncio.wait_for(self.channel.drain(), self.limits.send_timeout_s)
        except (ConnectionError, OSError, TimeoutError) as e:
            raise ClientGone(str(e) or type(e).__name__) from None

    async def reply(
        self, status: int, body: bytes, content_type: bytes = b"application/json", extra: Iterable = ()
    ) -> None:
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *extra]
        await self.send(h11.Response(status_code=status, headers=self.closing(headers)))
        if not self.head_only:
            await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    async def refuse(self, status: int, message: str, *, close: bool = True, extra: Iterable = ()) -> None:
        """An error answer the hop writes itself; with close, the connection ends after it."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        kind = {429: "rate_limit_error", 503: "unavailable_error"}.get(status, "invalid_request_error")
        headers = [(b"connection", b"close")] if close else []
        with contextlib.suppress(ClientGone, h11.LocalProtocolError):
            await self.reply(status, error_body(status, message, kind), extra=[*headers, *extra])

    async def _refuse_unparsed(self, status: int, message: str) -> None:
        """An error answer to a head h11 has not parsed (so it cannot frame it), then close after a linger."""
        body = error_body(status, message, "invalid_request_error")
        reason = {400: b"Bad Request"}.get(status, b"Error")
        self.transport.write(
            b"HTTP/1.1 %d %b\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%b"
            % (status, reason, len(body), body)
        )
        with contextlib.suppress(ClientGone):
            await self.drain()
        await self._linger()

    async def peek_body(self, length: int, deadline_s: float) -> bytes | None:
        """The request body of `length` bytes (Content-Length, at most the hop's cap), read into h11's buffer and
        left there for the exchange to forward; None when it does not all arrive within `deadline_s` (then the
        exchange reads it as before and its own limits answer)."""
        until = time.monotonic() + deadline_s
        while len(self.h11.trailing_data[0]) < length:
            left = until - time.monotonic()
            if left <= 0 or self.peer_eof:
                return None
            try:
                await self.receive(min(self.limits.body_timeout_s, left))
            except TimeoutError:
                return None
        return bytes(self.h11.trailing_data[0][:length])

    def take_buffered_body(self) -> bool:
        """Read past the request body in the bytes that have arrived, never waiting for more: True when it ended
        there. An answer given before its body arrived (a refusal, /health) never waits for the rest of it."""
        while self.h11.their_state is h11.SEND_BODY:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:
                return False
            if not isinstance(event, h11.Data):
                return isinstance(event, h11.EndOfMessage)
        return self.h11.their_state is h11.DONE

    def closing(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """An answer to a request whose body has not all arrived says the connection closes after it."""
        coming = self.h11.their_state is h11.SEND_BODY and not self.take_buffered_body()
        if (coming or self.overflow) and not any(n.lower() == b"connection" for n, _ in headers):
            return [*headers, (b"connection", b"close")]
        return headers

    async def relay_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        kept = [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() != b"content-length"]
        headers = self.closing([*kept, (b"content-length", b"%d" % len(body))])
        await self.send(h11.Response(status_code=status, headers=headers))
        if body:
            await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())


def _repeated_length(buffered: bytes) -> bool:
    """More than one Content-Length field in the complete request head at the start of `buffered`.

    h11 collapses equal values into one (RFC 9112 6.3 (5) allows it) and refuses unequal ones; the hop refuses
    both: a repeated length is what a smuggling attempt sends, and no legitimate client does.
    """
    end = _HEAD_END.search(buffered)
    return end is not None and len(_LENGTH_FIELD.findall(buffered, 0, end.start())) > 1
