"""One forwarded request: the request body streams up to llama-server while its answer streams back (relay.py);
either side leaving ends both.

The request goes on a kept connection to llama-server (upstream.py) when one is idle, and once more on a new one
if llama-server had closed the kept one under it, only while no byte of the answer has arrived. One timer and one
callback per request stop the relay when the client leaves, the request body fails, or llama-server goes silent
for upstream_timeout_s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import h11

from gguf_serve.container.hop.answer import LAST_CHUNK, AnswerReader, frame_chunk, frame_request
from gguf_serve.container.hop.chunked import ChunkedError
from gguf_serve.container.hop.client import HOP_BY_HOP, READ_SIZE, ClientConnection, ClientGone, Hop, Refused
from gguf_serve.container.hop.connections import BODY, BUSY
from gguf_serve.container.hop.metrics import RequestRecord
from gguf_serve.container.hop.relay import Answer
from gguf_serve.container.hop.upstream import RESEND_MAX_BYTES, UpstreamConnection, UpstreamPool

log = logging.getLogger("gguf-serve-hop")


class Unreachable(Exception):
    """No connection to llama-server could be made."""


@dataclass(frozen=True)
class Via:
    """Another endpoint a request goes to instead of llama-server (models.py routes): its connections, its Host,
    and the headers that name what it is for."""

    pool: UpstreamPool
    netloc: str
    headers: tuple[tuple[bytes, bytes], ...]


class Exchange(Answer):
    """One forwarded request: the body streams up while the answer streams back; either side leaving ends both."""

    def __init__(
        self,
        conn: ClientConnection,
        request: h11.Request,
        route: str,
        chunked: bool,
        record: RequestRecord | None,
        via: Via | None = None,
    ) -> None:
        self.conn = conn
        self.via = via
        self.pool = via.pool if via is not None else conn.server.upstream
        self.server = conn.server
        self.request = request
        self.route = route
        self.chunked = chunked
        self.record = record
        self.up = AnswerReader(request.method, limit=READ_SIZE)
        self.upstream: UpstreamConnection | None = None
        self.head_sent = False
        self.completed = False  # the whole answer reached the client
        self._body: asyncio.Task[None] | None = None
        self.body_in = False  # the whole request body went to llama-server
        self._body_bytes = 0
        self._body_deadline: float | None = None
        self._early: BaseException | None = None  # what stopped the body before the pump ran; the pump raises it
        self._resend: list[bytes] | None = None  # sent on a kept connection, no answer byte yet: can go again
        self._resend_bytes = 0
        self._framed: list[bytes] = []  # framed for llama-server, not written yet
        self.keep_alive = False  # llama-server's answer leaves the connection open (HTTP/1.1, no Connection: close)
        self.answer_read = False  # and it was read to its end
        self._task: asyncio.Task[Any] | None = None
        self._relaying = False
        self._interrupt: BaseException | None = None  # why the relay was stopped from outside (body pump, silence)
        self.last_byte = 0.0
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
        except Unreachable as e:
            log.warning("upstream %s unreachable: %s", self.via.netloc if self.via else server.upstream_netloc, e)
            self._observe(502)
            await conn.refuse(502, "llama-server is not reachable", close=True)
        except ClientGone as e:
            if self.record is not None and not self.record.answered:
                self.record.client_closed = True
            log.debug("client left during the answer: %s", e)
        except (OSError, TimeoutError, h11.RemoteProtocolError, ChunkedError) as e:
            log.warning("upstream answer broke off: %s: %s", type(e).__name__, e)
            if self.head_sent:
                conn.transport.abort()  # no final chunk: the client sees a cut answer, not a complete one
                self._observe("upstream_closed")
            else:
                self._observe(502)
                await conn.refuse(502, "llama-server closed the connection without an answer")
        finally:
            self._release()  # first: the next request may take it while the body pump stops
            await self._stop_body()
        # Every request is counted, however it ended: not by whether its end was timed (the relay times the answer's
        # end before it writes it, and a client gone by then ended the exchange here uncounted, one stream in about
        # eight runs of the observability test).
        if self.record is not None and not self.record.observed:
            if self.record.finished is None:
                self.record.finished = time.monotonic()
            self.server.metrics.observe(self.record)

    async def _attempt(self, *, fresh: bool) -> None:
        """The request to a kept connection to llama-server (a new one with `fresh`, or when none is idle), the
        answer back. What went to a kept connection is kept until the answer's first byte, to send it again."""
        await self._stop_body()
        self._release()
        try:
            upstream = self.upstream = await self.pool.take(fresh=fresh)
        except (OSError, TimeoutError) as e:
            raise Unreachable(str(e) or type(e).__name__) from None
        self.up = AnswerReader(self.request.method, limit=READ_SIZE)
        self._framed = []
        again, self._resend = self._resend, [] if upstream.reused else None
        if again:
            upstream.write(b"".join(again))
        else:
            headers = forwarded_headers(self.server, self.request, self.chunked, via=self.via)
            self._send_up(frame_request(self.request.method, self.request.target, headers))
        self._take_buffered()
        if self._framed and self._early is None:
            upstream.write(b"".join(self._framed))
            self._framed.clear()
        # A body that came whole with its head (a chat request almost always does) needs no pump: the client's
        # end is watched by a callback from its connection (`_watch_client`), not by a task reading it.
        self._body = None if self.body_in else asyncio.create_task(self._pump_body())
        await self._relay_watched(upstream, self._body)

    def _send_up(self, data: bytes, body: int = 0) -> None:
        """Bytes framed for llama-server (`body` of them the request body's); _flush_up writes what is framed (a
        head and a body that came with it go out in one write)."""
        self._framed.append(data)
        if self._resend is not None:
            self._resend.append(data)
            self._resend_bytes += body
            if self._resend_bytes > RESEND_MAX_BYTES:
                self._resend = None

    async def _flush_up(self) -> None:
        assert self.upstream is not None
        if self._framed:
            self.upstream.write(b"".join(self._framed))
            self._framed.clear()
        await self.upstream.drain()

    async def _stop_body(self) -> None:
        self.conn.channel.on_end = None
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
        if self.answer_read and self.keep_alive and self.body_in and self.server.drain is None:
            self.pool.give_back(upstream)
        else:
            upstream.close()

    def _observe(self, status: int | str) -> None:
        if self.record is not None and not self.record.observed:
            self.record.status = status  # type: ignore[assignment]
            if self.record.finished is None:
                self.record.finished = time.monotonic()
            self.server.metrics.observe(self.record)

    # --- stopping the relay from outside: one timer and one callback per request, not a wait per read ---------------
    async def _relay_watched(self, upstream: UpstreamConnection, body: asyncio.Task[None] | None) -> None:
        """The relay, stopped (its task cancelled at whatever it awaits) when the body pump fails or the client
        leaves (a 413, an EOF) or llama-server sends nothing for upstream_timeout_s; the cause is raised in place of
        the cancel."""
        loop = asyncio.get_running_loop()
        self._task, self._relaying, self.last_byte = asyncio.current_task(), True, time.monotonic()
        self._interrupt = None
        if body is None:
            self._watch_client()
        else:
            body.add_done_callback(self._body_ended)
        self._silence = loop.call_later(self.server.upstream_timeout_s, self._check_silence)
        try:
            await self.relay_answer(upstream)
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
        if body is self._body and not body.cancelled() and (failed := body.exception()) is not None:
            if isinstance(failed, ConnectionError):
                # Writing to llama-server failed (the client's side fails as ClientGone): it may have answered
                # first and closed (a 401 before it read a keyless body). The relay goes on and reads that answer
                # (upstream.py keeps it), or the break (a 502), or the silence.
                return
            self._stop_relay(failed)

    def _watch_client(self) -> None:
        """With the whole body in and no pump: the client's EOF or reset stops the relay, as the pump's would. An
        EOF already in stops it at the relay's first wait (a cancel of the running task lands at its next await)."""
        channel = self.conn.channel
        if channel.ended:
            self._client_left()
        else:
            channel.on_end = self._client_left

    def _client_left(self) -> None:
        self._stop_relay(ClientGone("the client closed while waiting for the answer"))

    def _check_silence(self) -> None:
        timeout = self.server.upstream_timeout_s
        quiet = time.monotonic() - self.last_byte
        if quiet >= timeout:
            self._stop_relay(TimeoutError(f"no byte from llama-server in {timeout} s"))
        elif self._relaying:
            self._silence = asyncio.get_running_loop().call_later(timeout - quiet, self._check_silence)

    async def _interrupted(self, reason: BaseException) -> None:
        """Raise what stopped the relay as the relay itself would have: a timeout, or the client gone."""
        if isinstance(reason, TimeoutError):
            raise reason
        if isinstance(reason, ConnectionError):  # writing to llama-server failed (the client side is ClientGone)
            raise reason
        if isinstance(reason, h11.RemoteProtocolError):  # a malformed chunked request body
            reason = Refused(400, f"bad request body: {reason}")
        if isinstance(reason, Refused):
            self._observe(reason.status)
            if not self.head_sent:
                await self.conn.refuse(reason.status, reason.message)
            raise ClientGone(reason.message)
        raise reason if isinstance(reason, ClientGone) else ClientGone(str(reason))

    def _body_event(self, event: h11.Event) -> None:
        """A piece of the request body (or its end) from the client's h11, framed for llama-server."""
        if isinstance(event, h11.Data):
            self._body_bytes += len(event.data)
            if self._body_bytes > self.conn.limits.max_body_bytes:
                raise Refused(413, "request body over the limit")
            self._send_up(frame_chunk(event.data) if self.chunked else event.data, len(event.data))
        elif isinstance(event, h11.EndOfMessage):
            self._send_up(LAST_CHUNK if self.chunked else b"")
            self.body_in = True
            self.conn.place(BUSY)
        else:
            raise ClientGone(f"unexpected {type(event).__name__}")

    def _take_buffered(self) -> None:
        """The body that came with the head, framed now, so that head and body go to llama-server in this turn
        rather than in the pump's first step; what stops the body here (413, a bad chunk) the pump raises."""
        try:
            while not self.body_in and self._early is None:
                event = self.conn.h11.next_event()
                if event is h11.NEED_DATA:
                    return
                self._body_event(event)
        except (Refused, ClientGone, h11.RemoteProtocolError) as e:
            self._early = e

    async def _pump_body(self) -> None:
        """The request body to llama-server as the client sends it; then watch for the client leaving. Started
        again after a resend: it goes on from what h11 has not given yet."""
        conn, limits = self.conn, self.conn.limits
        if self._body_deadline is None:
            self._body_deadline = time.monotonic() + limits.body_deadline_s
        deadline = self._body_deadline
        if conn.h11.their_state is h11.SEND_BODY:
            conn.place(BODY)
        early, self._early = self._early, None
        if early is not None:
            raise early
        while not self.body_in:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                await self._flush_up()
                if conn.h11.they_are_waiting_for_100_continue:
                    await conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                if conn.peer_eof:
                    raise ClientGone("the client closed mid-body")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Refused(408, f"request body not complete in {limits.body_deadline_s:g} s")
                try:
                    await conn.receive(min(limits.body_timeout_s, left))
                except TimeoutError:
                    # Which wait ended, not the clock read after it: uvloop's timers run on libuv's millisecond
                    # clock and may end up to a millisecond before time.monotonic() reaches the deadline.
                    if left > limits.body_timeout_s:
                        raise ClientGone("request body timeout") from None
                    raise Refused(408, f"request body not complete in {limits.body_deadline_s:g} s") from None
                continue
            self._body_event(event)
            if self.body_in:
                await self._flush_up()
        # The body is in. A read that ends (EOF or reset) means the client left: stop the answer, free the slot.
        while not conn.peer_eof and len(conn.h11.trailing_data[0]) <= limits.max_header_bytes:
            try:
                await conn.receive(limits.idle_timeout_s)
            except TimeoutError:
                continue
        if conn.peer_eof:
            raise ClientGone("the client closed while waiting for the answer")


def forwarded_headers(
    server: Hop, request: h11.Request, chunked: bool, *, bodiless: bool = False, via: Via | None = None
) -> list[tuple[bytes, bytes]]:
    dropped = HOP_BY_HOP | {b"content-length"} if bodiless else HOP_BY_HOP  # a body the hop does not forward
    if via is not None:  # its own naming headers replace any the client sent
        dropped = dropped | {n.lower() for n, _ in via.headers}
    headers = [(b"Host", (via.netloc if via is not None else server.upstream_netloc).encode())]
    headers += [(n, v) for n, v in request.headers.raw_items() if n.lower() not in dropped]
    if via is not None:
        headers += list(via.headers)
    if chunked:
        headers.append((b"Transfer-Encoding", b"chunked"))
    return headers
