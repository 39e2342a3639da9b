"""The hop: an asyncio HTTP/1.1 reverse proxy in front of llama-server, parsing both sides with h11.

One event loop serves every connection: an idle or half-sent connection costs a coroutine and a few KiB, not a
thread. h11 (RFC 9112, pure Python) frames requests and upstream responses; on top of it the hop refuses what
would be ambiguous to forward (Content-Length with Transfer-Encoding, a target that is not origin-form) and
bounds what a client can hold: header, body and idle timeouts, a body cap answered with 413, a connection cap
that evicts the longest-idle connection first. Request bodies stream to llama-server piece by piece and answers
stream back the same way (TCP_NODELAY), so an SSE stream reaches the client token by token. Headers, the
Authorization header included, go upstream unchanged and are never logged: llama-server checks the API key.

Admission: past `slots * (1 + queue_per_slot)` slot-taking requests in flight, the hop answers 429 with
Retry-After instead of queueing without bound. GET /health is answered within `health_timeout_s` whatever the
load; GET /metrics is llama-server's own /metrics (with the caller's key) followed by the hop's families.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import h11

from gguf_serve.container.hop.auth import UNAUTHORIZED_BODY, UNAUTHORIZED_TYPE, ApiKeys, needs_key
from gguf_serve.container.hop.chunked import ChunkedDecoder, ChunkedError
from gguf_serve.container.hop.connections import BODY, BUSY, IDLE, ConnectionTable
from gguf_serve.container.hop.drain import Drainer, DrainState
from gguf_serve.container.hop.gpu import GpuReader
from gguf_serve.container.hop.metrics import RequestMetrics, RequestRecord, SseTokenScanner
from gguf_serve.container.hop.upstream import RESEND_MAX_BYTES, UPSTREAM_SPARE, UpstreamConnection, UpstreamPool

log = logging.getLogger("gguf-serve-hop")

GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/completion"}
)
# POST routes of llama-server (tools/server/server.cpp) that take a slot: these count against admission.
SLOT_PATHS = GENERATION_PATHS | frozenset(
    {"/v1/responses", "/responses", "/v1/messages", "/infill", "/embedding", "/embeddings", "/v1/embeddings",
     "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v1/audio/transcriptions", "/audio/transcriptions"}
)  # fmt: skip
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"trailers",
     b"transfer-encoding", b"upgrade", b"host", b"expect", b"proxy-connection"}
)  # fmt: skip
MAX_KEPT_BODY = 8 * 1024 * 1024  # a non-streamed answer is read for its timings up to this size
MAX_METRICS_BODY = 16 * 1024 * 1024
READ_SIZE = 65536
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # where h11 ends a request head (it accepts bare LF line ends too)
_LINE_END = re.compile(rb"\r?\n")
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HEALTH_ALIVE_S = 10.0  # upstream bytes this recent stand for a /health that llama-server did not answer in time


@dataclass(frozen=True)
class Limits:
    """What one client can hold. Times in seconds, sizes in bytes."""

    max_body_bytes: int = 64 * 1024 * 1024  # larger request bodies get 413 (a long prompt is a few MiB of JSON)
    max_header_bytes: int = 32 * 1024  # request line and headers; more gets 431
    header_timeout_s: float = 10.0  # from a request's first byte to the end of its headers
    body_timeout_s: float = 30.0  # between two pieces of a request body
    body_deadline_s: float = 120.0  # for a whole request body (64 MiB at 4.5 Mbit/s); then 408
    idle_timeout_s: float = 620.0  # keep-alive between requests: above the ALB's 600 s idle timeout
    send_timeout_s: float = 120.0  # a client that takes no bytes for this long is gone
    max_connections: int = 4096  # past it, the longest-idle connection is closed for the new one
    overflow_connections: int = 64  # past a full table of busy connections: these answer GET /health only
    connect_timeout_s: float = 5.0
    health_timeout_s: float = 0.5


@dataclass(frozen=True)
class Admission:
    """Slot-taking requests in flight beyond slots * (1 + queue_per_slot) are shed with 429."""

    slots: int = 1
    queue_per_slot: int | None = None  # None: never shed
    retry_after_s: int = 2

    @property
    def limit(self) -> int | None:
        return None if self.queue_per_slot is None else self.slots * (1 + self.queue_per_slot)


def error_body(status: int, message: str, kind: str, code: str | None = None) -> bytes:
    """llama-server's error shape, which is OpenAI's ({"error": {"message", "type", "code"}})."""
    return json.dumps({"error": {"code": code or status, "message": message, "type": kind, "param": None}}).encode()


class ProxyServer:
    """Binds at construction (errors surface there); `serve_forever` runs the loop in the calling thread."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: str,
        *,
        metrics: RequestMetrics | None = None,
        gpu: GpuReader | None = None,
        upstream_timeout_s: float = 900.0,
        limits: Limits | None = None,
        admission: Admission | None = None,
        drainer: Drainer | None = None,
        keys: ApiKeys | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.upstream_netloc = parts.netloc
        self.metrics = metrics or RequestMetrics()
        self.gpu = gpu
        self.upstream_timeout_s = upstream_timeout_s
        self.limits = limits or Limits()
        self.admission = admission or Admission()
        self.metrics.admission_limit = self.admission.limit
        self.in_flight = 0  # slot-taking requests admitted and not finished
        self.keys = keys  # llama-server's API keys: a request without one is answered 401 here (auth.py)
        self.drainer = drainer  # watches IMDS and drains on a notice (gguf_serve/container/hop/drain.py)
        self.drain: DrainState | None = None  # once set, new slot-taking requests get 503 until the process ends
        self.last_upstream_byte = 0.0  # time.monotonic() of the last byte read from llama-server
        self.upstream = UpstreamPool(
            self.upstream_host,
            self.upstream_port,
            size=(self.admission.limit or self.admission.slots) + UPSTREAM_SPARE,  # a burst the hop admits, kept
            connect_timeout_s=self.limits.connect_timeout_s,
        )
        self._connections = ConnectionTable(self.limits.max_connections, self.limits.overflow_connections)
        self._sock = socket.create_server(listen, backlog=1024, reuse_port=False)
        self.server_address = self._sock.getsockname()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._finished = threading.Event()

    def __enter__(self) -> ProxyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server_close()

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._finished.set()

    def shutdown(self) -> None:
        """From another thread: stop serving and wait for serve_forever to return."""
        if not self._started.wait(10) or self._loop is None or self._stop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended
            self._loop.call_soon_threadsafe(self._stop.set)
        self._finished.wait(10)

    def server_close(self) -> None:
        self._sock.close()

    def rewrite(self, request: h11.Request) -> h11.Request:
        """The request as the hop handles it: unchanged here. A front that maps its own routes onto llama-server's
        overrides this (gguf_serve/container/sagemaker/front.py) and raises Refused for what it does not serve."""
        return request

    def begin_drain(self, reason: str, deadline: float) -> DrainState:
        """From the loop: stop taking requests; the ones admitted run on. `deadline` is a time.time()."""
        if self.drain is None:
            self.drain = DrainState(reason, deadline, running_at_start=self.in_flight)
            left = deadline - time.time()
            log.info("draining (%s): %d streams running, %.0f s to the deadline", reason, self.in_flight, left)
        return self.drain

    def end_drain(self) -> DrainState | None:
        """Close the drain's books: what still runs now is counted as cut. New requests are still refused."""
        drain = self.drain
        if drain is not None and not drain.done:
            drain.cut, drain.ended = self.in_flight, time.time()
        return drain

    def resume(self) -> None:
        """From the loop: back in service (the group returned it from Standby): take requests again."""
        if self.drain is not None:
            log.info("serving again after the drain (%s)", self.drain.reason)
        self.drain = None

    def hop_exposition(self) -> str:
        self.metrics.connections = len(self._connections)
        self.metrics.evicted = self._connections.evicted
        self.metrics.in_flight = self.in_flight
        self.metrics.draining = self.drain is not None
        if self.drain is not None and self.drain.cut is not None:
            self.metrics.drain_cut = self.drain.cut
        return self.metrics.exposition() + (self.gpu.exposition() if self.gpu else "")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, sock=self._sock, limit=READ_SIZE)
        watch = asyncio.create_task(self.drainer.run(self)) if self.drainer is not None else None
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            self.upstream.close()
            if watch is not None:
                watch.cancel()
            tasks = [c.task for c in self._connections if c.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(self, reader, writer)
        place = self._connections.admit(conn)
        if place is None:  # every connection is answering and the overflow is full: refuse rather than grow
            writer.transport.abort()
            return
        conn.overflow = place == "overflow"
        conn.task = asyncio.current_task()
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass  # closed for a newer connection, or the hop stops: the transport is gone already
        finally:
            self._connections.forget(conn)


class _ClientGone(Exception):
    """The client closed, reset or stopped reading."""


class _Refused(Exception):
    """A request the hop answers itself with an error, never forwarded."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


Refused = _Refused  # what ProxyServer.rewrite raises for a request it answers itself with an error


class _Connection:
    """One client connection: requests one after another (h11 keeps pipelined bytes until the cycle ends)."""

    def __init__(self, server: ProxyServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.limits = server.limits
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=server.limits.max_header_bytes)
        self.overflow = False  # let in past a full table: answers GET /health only, then closes
        self.task: asyncio.Task[Any] | None = None
        self.peer_eof = False
        self.head_only = False  # the current request is HEAD: answers carry no body
        self._read: asyncio.Future[bytes] | None = None

    def place(self, where: str) -> None:
        self.server._connections.place(self, where)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.writer.transport.abort()

    async def run(self) -> None:
        try:
            while True:
                self.place(IDLE)
                try:
                    event = await self._next_request()
                except h11.RemoteProtocolError as e:
                    await self._refuse(e.error_status_hint, f"bad request: {e}")
                    return
                if not isinstance(event, h11.Request):
                    return
                self.place(BUSY)
                await self._handle(event)
                if self.h11.our_state is h11.DONE and self.h11.their_state is h11.SEND_BODY:
                    self._take_buffered_body()  # answered before its body arrived: kept only if the body is in
                if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE or self.overflow:
                    return
                self.h11.start_next_cycle()
        except (_ClientGone, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except h11.LocalProtocolError as e:
            log.warning("connection ended: %s", e)
        finally:
            if self.h11.our_state is h11.ERROR:
                self.writer.transport.abort()
            else:
                if self.h11.their_state not in (h11.DONE, h11.IDLE, h11.CLOSED) and not self.peer_eof:
                    await self._linger()
                self.writer.close()
            if self._read is not None:
                self._read.cancel()

    async def _linger(self, seconds: float = 2.0, most: int = 4 * 1024 * 1024) -> None:
        """After an answer to a request whose body is still arriving (413, 429, 408): half-close and drop what
        comes for a moment, so that the client reads the answer before the close resets the connection."""
        end, dropped = time.monotonic() + seconds, 0
        with contextlib.suppress(Exception):
            self.writer.write_eof()
            while dropped < most and (left := end - time.monotonic()) > 0:
                read, self._read = self._read or asyncio.ensure_future(self.reader.read(READ_SIZE)), None
                done, _ = await asyncio.wait({read}, timeout=left)
                if not done:
                    read.cancel()
                    return
                data = read.result()
                if not data:
                    return
                dropped += len(data)

    async def _receive(self, timeout: float, size: int = READ_SIZE) -> None:
        """Feed h11 the next bytes. The read outlives a timeout or a cancelled caller and is picked up by the next
        call: cancelling a read that already got bytes would lose them (asyncio.wait_for's race)."""
        if self._read is None:
            self._read = asyncio.ensure_future(self.reader.read(size))
        done, _ = await asyncio.wait({self._read}, timeout=timeout)
        if not done:
            raise TimeoutError
        read, self._read = self._read, None
        try:
            data = read.result()
        except (ConnectionError, OSError) as e:
            raise _ClientGone(str(e)) from None
        if not data:
            self.peer_eof = True
        self.h11.receive_data(data)

    async def _next_request(self) -> h11.Request | h11.ConnectionClosed:
        """The next request head: idle_timeout_s for its first byte, then header_timeout_s for all of it."""
        deadline = time.monotonic() + self.limits.header_timeout_s if self.overflow else None
        while True:
            if self.h11.their_state is h11.IDLE and _repeated_length(self.h11.trailing_data[0]):
                await self._refuse_unparsed(400, "bad request: more than one Content-Length")
                raise _ClientGone("repeated Content-Length")
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if deadline is None and self.h11.trailing_data[0]:
                    deadline = time.monotonic() + self.limits.header_timeout_s
                wait = self.limits.idle_timeout_s if deadline is None else deadline - time.monotonic()
                if wait <= 0:
                    await self._refuse(408, "request headers not complete in time")
                    raise _ClientGone("header timeout")
                # h11 checks its limit on incomplete heads only: never read past it, so that a bigger head is one
                room = self.limits.max_header_bytes + 1 - len(self.h11.trailing_data[0])
                try:
                    await self._receive(wait, size=max(1, room))
                except TimeoutError:
                    if deadline is not None:
                        await self._refuse(408, "request headers not complete in time")
                    raise _ClientGone("timeout") from None
                continue
            if isinstance(event, h11.Request | h11.ConnectionClosed):
                return event
            raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}", error_status_hint=400)

    async def _send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self._write(data)

    async def _write(self, data: bytes) -> None:
        """Bytes to the client; waits (at most send_timeout_s) only while its buffer is over the high-water mark:
        a drain wrapped in wait_for on every token cost a task and a timer each."""
        transport = self.writer.transport
        if transport.is_closing():
            raise _ClientGone("the client connection closed")
        self.writer.write(data)
        if transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]:
            try:
                await asyncio.wait_for(self.writer.drain(), self.limits.send_timeout_s)
            except (ConnectionError, OSError, TimeoutError) as e:
                raise _ClientGone(str(e) or type(e).__name__) from None

    async def _reply(
        self, status: int, body: bytes, content_type: bytes = b"application/json", extra: Iterable = ()
    ) -> None:
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *extra]
        await self._send(h11.Response(status_code=status, headers=self._closing(headers)))
        if not self.head_only:
            await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())

    async def _refuse(self, status: int, message: str, *, close: bool = True, extra: Iterable = ()) -> None:
        """An error answer the hop writes itself; with close, the connection ends after it."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        kind = {429: "rate_limit_error", 503: "unavailable_error"}.get(status, "invalid_request_error")
        headers = [(b"connection", b"close")] if close else []
        with contextlib.suppress(_ClientGone, h11.LocalProtocolError):
            await self._reply(status, error_body(status, message, kind), extra=[*headers, *extra])

    async def _refuse_unparsed(self, status: int, message: str) -> None:
        """An error answer to a head h11 has not parsed (so it cannot frame it), then close after a linger."""
        body = error_body(status, message, "invalid_request_error")
        reason = {400: b"Bad Request"}.get(status, b"Error")
        self.writer.write(
            b"HTTP/1.1 %d %b\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%b"
            % (status, reason, len(body), body)
        )
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await asyncio.wait_for(self.writer.drain(), self.limits.send_timeout_s)
        await self._linger()

    def _take_buffered_body(self) -> bool:
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

    def _closing(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """An answer to a request whose body has not all arrived says the connection closes after it."""
        coming = self.h11.their_state is h11.SEND_BODY and not self._take_buffered_body()
        if (coming or self.overflow) and not any(n.lower() == b"connection" for n, _ in headers):
            return [*headers, (b"connection", b"close")]
        return headers

    async def _handle(self, request: h11.Request) -> None:
        started = time.monotonic()
        self.head_only = request.method == b"HEAD"
        try:
            request = self.server.rewrite(request)
            route, length, chunked = self._check(request)
        except _Refused as e:
            await self._refuse(e.status, e.message)
            return
        method = request.method.decode("ascii")
        server = self.server
        if method == "GET" and route in ("/health", "/v1/health"):
            await self._health(request)
            return
        if self.overflow:
            retry = [(b"retry-after", b"%d" % server.admission.retry_after_s)]
            await self._refuse(503, f"the hop holds {self.limits.max_connections} connections; retry", extra=retry)
            return
        has_body = chunked or bool(length)
        keyless = server.keys is not None and needs_key(request.method, route, has_body)
        if keyless and not server.keys.accepts(request.headers):  # type: ignore[union-attr]
            server.metrics.unauthorized += 1  # answered here: no body read, no admission place, not shed
            await self._reply(401, UNAUTHORIZED_BODY, UNAUTHORIZED_TYPE)
            return
        slot = method == "POST" and route in SLOT_PATHS
        measured = method == "POST" and route in GENERATION_PATHS
        record = RequestRecord(started) if measured else None
        if slot and server.drain is not None:  # leaving: another instance takes the retry
            server.drain.refused += 1
            server.metrics.drain_refused += 1
            reason = f"this instance is draining ({server.drain.reason}); retry, another instance will answer"
            await self._refuse_slot(503, reason, record, length)
            return
        limit = server.admission.limit
        if slot and limit is not None and server.in_flight >= limit:
            server.metrics.shed += 1
            reason = f"llama-server has {server.in_flight} requests for {server.admission.slots} slots; retry later"
            await self._refuse_slot(429, reason, record, length)
            return
        if slot:
            server.in_flight += 1
        exchange = _Exchange(self, request, route, chunked, record)
        try:
            await exchange.run()
        finally:
            if slot:
                server.in_flight -= 1
                drain = server.drain
                if drain is not None and not drain.done:  # admitted before the drain began
                    if exchange.completed:
                        drain.finished += 1
                    else:
                        drain.broken += 1

    def _check(self, request: h11.Request) -> tuple[str, int | None, bool]:
        """(route as llama-server matches it, Content-Length, chunked), or _Refused for what is not forwarded."""
        target = request.target
        if not target.startswith(b"/"):
            raise _Refused(400, "the request target must be a path (origin-form)")
        if request.http_version not in (b"1.0", b"1.1"):
            raise _Refused(505, f"HTTP/{request.http_version.decode('ascii')} is not served here; use HTTP/1.1")
        lengths = [v for n, v in request.headers if n == b"content-length"]
        chunked = any(n == b"transfer-encoding" for n, _ in request.headers)
        if lengths and chunked:  # RFC 9112 6.1: a proxy must not forward such a request; llama-server reads both
            raise _Refused(400, "Content-Length together with Transfer-Encoding")
        length = int(lengths[0]) if lengths else None  # h11 took digits only and equal duplicates as one
        if length is not None and length > self.limits.max_body_bytes:
            raise _Refused(413, f"request body of {length} bytes; the hop takes at most {self.limits.max_body_bytes}")
        # cpp-httplib routes on the part before '#' and '?', percent-decoded (decode_path_component)
        path = target.split(b"#", 1)[0].split(b"?", 1)[0].decode("latin-1")
        return unquote(path, errors="replace"), length, chunked

    async def _refuse_slot(self, status: int, reason: str, record: RequestRecord | None, length: int | None) -> None:
        """A request that would take a slot, refused with Retry-After (503 draining, 429 over admission): counted
        in the request metrics, and the connection kept when its small body can be read past."""
        if record is not None:
            record.status = status
            self.server.metrics.observe(record)
        keep = self._take_buffered_body()  # a body still on its way is never waited for: the connection closes
        retry = [(b"retry-after", b"%d" % self.server.admission.retry_after_s)]
        await self._refuse(status, reason, close=not keep, extra=retry)

    async def _health(self, request: h11.Request) -> None:
        """llama-server's own /health when it answers in time; otherwise an answer from what the hop saw."""
        server = self.server
        if server.drain is not None:  # the target group's health check: stop choosing this instance
            await self._reply(
                503,
                error_body(503, f"draining ({server.drain.reason})", "unavailable_error"),
                extra=[(b"retry-after", b"%d" % server.admission.retry_after_s)],
            )
            return
        try:
            status, headers, body = await asyncio.wait_for(
                _fetch(server, request, limit=65536), self.limits.health_timeout_s
            )
        except (TimeoutError, OSError, h11.ProtocolError) as e:
            # Busy (a timeout) while bytes flow is alive; a refused or reset connection is llama-server gone.
            alive = isinstance(e, TimeoutError) and time.monotonic() - server.last_upstream_byte < HEALTH_ALIVE_S
            log.debug("upstream /health: %s; upstream %s", type(e).__name__, "streaming" if alive else "silent")
            if alive:  # busy answering others: the HTTP threads are taken, the model is loaded
                await self._reply(200, b'{"status":"ok"}')
            else:
                await self._reply(503, error_body(503, "llama-server did not answer /health", "unavailable_error"))
            return
        await self._relay_whole(status, headers, body)

    async def _relay_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        kept = [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() != b"content-length"]
        headers = self._closing([*kept, (b"content-length", b"%d" % len(body))])
        await self._send(h11.Response(status_code=status, headers=headers))
        if body:
            await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())


def _repeated_length(buffered: bytes) -> bool:
    """More than one Content-Length field in the complete request head at the start of `buffered`.

    h11 collapses equal values into one (RFC 9112 6.3 (5) allows it) and refuses unequal ones; the hop refuses
    both: a repeated length is what a smuggling attempt sends, and no legitimate client does.
    """
    end = _HEAD_END.search(buffered)
    if end is None:
        return False
    fields = _LINE_END.split(buffered[: end.start()])[1:]
    return sum(1 for f in fields if f.partition(b":")[0].lower() == b"content-length") > 1


def _forwarded_headers(
    server: ProxyServer, request: h11.Request, chunked: bool, *, bodiless: bool = False
) -> list[tuple[bytes, bytes]]:
    dropped = HOP_BY_HOP | {b"content-length"} if bodiless else HOP_BY_HOP  # a body the hop does not forward
    headers = [(b"Host", server.upstream_netloc.encode())]
    headers += [(n, v) for n, v in request.headers.raw_items() if n.lower() not in dropped]
    if chunked:
        headers.append((b"Transfer-Encoding", b"chunked"))
    return headers


async def _fetch(server: ProxyServer, request: h11.Request, *, limit: int) -> tuple[int, list, bytes]:
    """A bodiless request to llama-server with the caller's headers; the whole answer, up to `limit` bytes."""
    upstream = await server.upstream.connect()  # a new connection: a health check never waits on a kept one
    reader, writer = upstream.reader, upstream.writer
    try:
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=READ_SIZE)
        headers = _forwarded_headers(server, request, False, bodiless=True)
        head = h11.Request(method=request.method, target=request.target, headers=headers)
        writer.write(up.send(head) + up.send(h11.EndOfMessage()))
        status, headers, body = 0, [], bytearray()
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(READ_SIZE)
                up.receive_data(data)
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, list(event.headers.raw_items())
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise h11.RemoteProtocolError(f"upstream answer over {limit} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("upstream closed without an answer")
    finally:
        writer.transport.abort()


class _Unreachable(Exception):
    """No connection to llama-server could be made."""


class _Exchange:
    """One forwarded request: the body streams up while the answer streams back; either side leaving ends both."""

    def __init__(
        self, conn: _Connection, request: h11.Request, route: str, chunked: bool, record: RequestRecord | None
    ) -> None:
        self.conn = conn
        self.server = conn.server
        self.request = request
        self.route = route
        self.chunked = chunked
        self.record = record
        self.up = h11.Connection(h11.CLIENT, max_incomplete_event_size=READ_SIZE)
        self.upstream: UpstreamConnection | None = None
        self.head_sent = False
        self.completed = False  # the whole answer reached the client
        self._body: asyncio.Task[None] | None = None
        self._body_in = False  # the whole request body went to llama-server
        self._body_bytes = 0
        self._body_deadline: float | None = None
        self._resend: list[h11.Event] | None = None  # sent on a kept connection, no answer byte yet: can go again
        self._resend_bytes = 0
        self._framed: list[bytes] = []  # framed for llama-server, not written yet
        self._keep_alive = False  # llama-server's answer leaves the connection open (HTTP/1.1, no Connection: close)
        self._answer_read = False  # and it was read to its end
        self._task: asyncio.Task[Any] | None = None
        self._relaying = False
        self._interrupt: BaseException | None = None  # why the relay was stopped from outside (body pump, silence)
        self._last_byte = 0.0
        self._silence: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        server, conn = self.server, self.conn
        try:
            try:
                await self._attempt(fresh=False)
            except (ConnectionError, h11.RemoteProtocolError) as e:
                if self._resend is None:  # a new connection, or an answer under way: never sent twice
                    raise
                log.info("llama-server closed a kept connection (%s); the request goes again on a new one", e)
                await self._attempt(fresh=True)
        except _Unreachable as e:
            log.warning("upstream %s unreachable: %s", server.upstream_netloc, e)
            self._observe(502)
            await conn._refuse(502, "llama-server is not reachable", close=True)
        except _ClientGone as e:
            if self.record is not None and not self.record.answered:
                self.record.client_closed = True
            log.debug("client left during the answer: %s", e)
        except (OSError, TimeoutError, h11.RemoteProtocolError, ChunkedError) as e:
            log.warning("upstream answer broke off: %s: %s", type(e).__name__, e)
            if self.head_sent:
                conn.writer.transport.abort()  # no final chunk: the client sees a cut answer, not a complete one
                self._observe("upstream_closed")
            else:
                self._observe(502)
                await conn._refuse(502, "llama-server closed the connection without an answer")
        finally:
            self._release()  # first: the next request may take it while the body pump stops
            await self._stop_body()
        if self.record is not None and self.record.finished is None:
            self.record.finished = time.monotonic()
            self.server.metrics.observe(self.record)

    async def _attempt(self, *, fresh: bool) -> None:
        """The request to a kept connection to llama-server (a new one with `fresh`, or when none is idle), the
        answer back. What went to a kept connection is kept until the answer's first byte, to send it again."""
        await self._stop_body()
        self._release()
        try:
            upstream = self.upstream = await self.server.upstream.take(fresh=fresh)
        except (OSError, TimeoutError) as e:
            raise _Unreachable(str(e) or type(e).__name__) from None
        self.up = h11.Connection(h11.CLIENT, max_incomplete_event_size=READ_SIZE)
        self._framed = []
        again, self._resend = self._resend, [] if upstream.reused else None
        if again:
            upstream.writer.write(b"".join([self.up.send(event) for event in again]))
        else:
            headers = _forwarded_headers(self.server, self.request, self.chunked)
            self._send_up(h11.Request(method=self.request.method, target=self.request.target, headers=headers))
        self._body = asyncio.create_task(self._pump_body())
        await self._relay_watched(upstream.reader, self._body)

    def _send_up(self, event: h11.Event) -> None:
        """Frame an event for llama-server; _flush_up writes what is framed (a head and a body that came with it
        go out in one write)."""
        self._framed.append(self.up.send(event))  # type: ignore[arg-type]
        if self._resend is not None:
            self._resend.append(event)
            self._resend_bytes += len(event.data) if isinstance(event, h11.Data) else 0
            if self._resend_bytes > RESEND_MAX_BYTES:
                self._resend = None

    async def _flush_up(self) -> None:
        assert self.upstream is not None
        if self._framed:
            self.upstream.writer.write(b"".join(self._framed))
            self._framed.clear()
        await self.upstream.writer.drain()

    async def _stop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.cancel()
            with contextlib.suppress(BaseException):
                await body

    def _release(self) -> None:
        """The connection back to the pool when the exchange ended cleanly both ways; otherwise closed."""
        upstream, self.upstream = self.upstream, None
        if upstream is None:
            return
        if self._answer_read and self._keep_alive and self._body_in and self.server.drain is None:
            self.server.upstream.give_back(upstream)
        else:
            upstream.close()

    def _observe(self, status: int | str) -> None:
        if self.record is not None and self.record.finished is None:
            self.record.status = status  # type: ignore[assignment]
            self.record.finished = time.monotonic()
            self.server.metrics.observe(self.record)

    # --- stopping the relay from outside: one timer and one callback per request, not a wait per read ---------------
    async def _relay_watched(self, reader: asyncio.StreamReader, body: asyncio.Task[None]) -> None:
        """The relay, stopped (its task cancelled at whatever it awaits) when the body pump fails (the client left,
        a 413) or llama-server sends nothing for upstream_timeout_s; the cause is raised in place of the cancel."""
        loop = asyncio.get_running_loop()
        self._task, self._relaying, self._last_byte = asyncio.current_task(), True, time.monotonic()
        self._interrupt = None
        body.add_done_callback(self._body_ended)
        self._silence = loop.call_later(self.server.upstream_timeout_s, self._check_silence)
        try:
            await self._relay(reader)
        except asyncio.CancelledError:
            self._relaying = False
            reason = self._interrupt
            if reason is None or (self._task is not None and self._task.uncancel() > 0):
                raise  # cancelled by the server's shutdown, not by us
            await self._interrupted(reason)
        finally:
            self._relaying = False
            self._silence.cancel()

    def _stop_relay(self, reason: BaseException) -> None:
        if self._relaying and self._interrupt is None and self._task is not None:
            self._interrupt = reason
            self._task.cancel()

    def _body_ended(self, body: asyncio.Task[None]) -> None:
        if body is self._body and not body.cancelled() and body.exception() is not None:
            self._stop_relay(body.exception())  # type: ignore[arg-type]

    def _check_silence(self) -> None:
        timeout = self.server.upstream_timeout_s
        quiet = time.monotonic() - self._last_byte
        if quiet >= timeout:
            self._stop_relay(TimeoutError(f"no byte from llama-server in {timeout} s"))
        elif self._relaying:
            self._silence = asyncio.get_running_loop().call_later(timeout - quiet, self._check_silence)

    async def _interrupted(self, reason: BaseException) -> None:
        """Raise what stopped the relay as the relay itself would have: a timeout, or the client gone."""
        if isinstance(reason, TimeoutError):
            raise reason
        if isinstance(reason, ConnectionError):  # writing to llama-server failed (the client side is _ClientGone)
            raise reason
        if isinstance(reason, h11.RemoteProtocolError):  # a malformed chunked request body
            reason = _Refused(400, f"bad request body: {reason}")
        if isinstance(reason, _Refused):
            self._observe(reason.status)
            if not self.head_sent:
                await self.conn._refuse(reason.status, reason.message)
            raise _ClientGone(reason.message)
        raise reason if isinstance(reason, _ClientGone) else _ClientGone(str(reason))

    async def _pump_body(self) -> None:
        """The request body to llama-server as the client sends it; then watch for the client leaving. Started
        again after a resend: it goes on from what h11 has not given yet."""
        conn, limits = self.conn, self.conn.limits
        if self._body_deadline is None:
            self._body_deadline = time.monotonic() + limits.body_deadline_s
        deadline = self._body_deadline
        if conn.h11.their_state is h11.SEND_BODY:
            conn.place(BODY)
        while not self._body_in:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                await self._flush_up()
                if conn.h11.they_are_waiting_for_100_continue:
                    await conn._send(h11.InformationalResponse(status_code=100, headers=[]))
                if conn.peer_eof:
                    raise _ClientGone("the client closed mid-body")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Refused(408, f"request body not complete in {limits.body_deadline_s:g} s")
                try:
                    await conn._receive(min(limits.body_timeout_s, left))
                except TimeoutError:
                    if time.monotonic() < deadline:
                        raise _ClientGone("request body timeout") from None
                continue
            if isinstance(event, h11.Data):
                self._body_bytes += len(event.data)
                if self._body_bytes > limits.max_body_bytes:
                    raise _Refused(413, "request body over the limit")
                self._send_up(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._send_up(h11.EndOfMessage())
                self._body_in = True
                conn.place(BUSY)
                await self._flush_up()
            else:
                raise _ClientGone(f"unexpected {type(event).__name__}")
        # The body is in. A read that ends (EOF or reset) means the client left: stop the answer, free the slot.
        while not conn.peer_eof and len(conn.h11.trailing_data[0]) <= limits.max_header_bytes:
            try:
                await conn._receive(limits.idle_timeout_s)
            except TimeoutError:
                continue
        if conn.peer_eof:
            raise _ClientGone("the client closed while waiting for the answer")

    async def _relay(self, reader: asyncio.StreamReader) -> None:
        conn, up, server, record = self.conn, self.up, self.server, self.record
        metrics_route = self.request.method == b"GET" and self.route == "/metrics"
        scanner: SseTokenScanner | None = None
        kept: bytearray | None = None
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                up.receive_data(await self._read_upstream(reader))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                self._keep_alive = _keeps_alive(event)
                if metrics_route:
                    await self._metrics(event, reader)
                    return
                headers = [(n, v) for n, v in event.headers.raw_items() if n.lower() not in HOP_BY_HOP]
                if record is not None:
                    record.status = event.status_code
                    ctype = event.headers and dict(event.headers).get(b"content-type", b"")
                    record.stream = bool(ctype) and ctype.startswith(b"text/event-stream")
                    scanner = SseTokenScanner(record) if record.stream else None
                    kept = bytearray() if not record.stream and event.status_code == 200 else None
                if conn.h11.their_state is h11.SEND_BODY:  # answered before the body is in: a refusal; then close
                    headers.append((b"connection", b"close"))
                await conn._send(h11.Response(status_code=event.status_code, headers=headers, reason=event.reason))
                self.head_sent = True
                if scanner is not None and self._chunked_both_ways(event):
                    await self._stream(reader, scanner, up.trailing_data[0])
                    return
            elif isinstance(event, h11.Data):
                if scanner is not None:
                    scanner.feed(event.data, time.monotonic())
                elif kept is not None and len(kept) + len(event.data) <= MAX_KEPT_BODY:
                    kept += event.data
                await conn._send(h11.Data(data=event.data))
                if scanner is not None and scanner.done and record is not None:
                    record.answered = True
            elif isinstance(event, h11.EndOfMessage):
                self._answer_read = not up.trailing_data[0]  # llama-server sends nothing after its answer
                if record is not None:
                    record.finished = time.monotonic()
                    if kept is not None:
                        record.timings = _timings(bytes(kept))
                # llama-server may answer before the body is in: then the client's h11 is not DONE and run() closes
                await conn._send(h11.EndOfMessage())
                self.completed = True
                if record is not None:
                    server.metrics.observe(record)
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("upstream closed")

    def _chunked_both_ways(self, response: h11.Response) -> bool:
        """llama-server sends the answer chunked, and h11 frames it chunked for this client (HTTP/1.1, a body)."""
        upstream = any(name == b"transfer-encoding" for name, _ in response.headers)
        client = self.conn.h11.their_http_version == b"1.1" and not self.conn.head_only
        return upstream and client and response.status_code not in (204, 304)

    async def _stream(self, reader: asyncio.StreamReader, scanner: SseTokenScanner, buffered: bytes) -> None:
        """An SSE answer, chunked both ways: each read is decoded in one call, its tokens timed, and its payload
        sent to the client as one chunk; h11 frames the head and the last chunk. The hop's cost per token."""
        conn, record, decoder = self.conn, self.record, ChunkedDecoder()
        assert record is not None  # a scanner exists only for a measured request
        data, chunk = buffered, b""
        while True:
            if data:
                payload = decoder.feed(data)
                chunk = b"%x\r\n%b\r\n" % (len(payload), payload) if payload else b""
                if payload:
                    scanner.feed(payload, time.monotonic())
                if decoder.done:
                    self._answer_read = True
                    break
                if chunk:
                    await conn._write(chunk)
                    if scanner.done:
                        record.answered = True  # a client may leave at [DONE], before the body's end
            data = await self._read_upstream(reader)
            if not data:
                raise h11.RemoteProtocolError("upstream closed in the middle of the answer")
        record.finished = time.monotonic()
        await conn._write(chunk + (conn.h11.send(h11.EndOfMessage()) or b""))  # the last payload and the end: one write
        record.answered = record.answered or scanner.done
        self.completed = True
        self.server.metrics.observe(record)

    async def _read_upstream(self, reader: asyncio.StreamReader) -> bytes:
        """The next bytes from llama-server (b"" at its end); the relay's watcher stops a silent one."""
        data = await reader.read(READ_SIZE)
        if data:
            self._last_byte = self.server.last_upstream_byte = time.monotonic()
            self._resend = None  # an answer under way: the request is never sent twice
        return data

    async def _metrics(self, response: h11.Response, reader: asyncio.StreamReader) -> None:
        up, conn = self.up, self.conn
        parts = bytearray()
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                up.receive_data(await self._read_upstream(reader))
            elif isinstance(event, h11.Data):
                parts += event.data
                if len(parts) > MAX_METRICS_BODY:
                    raise h11.RemoteProtocolError("upstream /metrics too large")
            elif isinstance(event, h11.EndOfMessage):
                self._answer_read = not up.trailing_data[0]
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
        await conn._relay_whole(response.status_code, headers, payload)


def _keeps_alive(response: h11.Response) -> bool:
    """HTTP/1.1 without `Connection: close`: llama-server keeps the connection for another request."""
    if response.http_version != b"1.1":
        return False
    return not any(name == b"connection" and b"close" in value.lower() for name, value in response.headers)


def _timings(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    timings = doc.get("timings") if isinstance(doc, dict) else None
    return timings if isinstance(timings, dict) else None
