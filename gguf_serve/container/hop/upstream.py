"""The hop's connections to llama-server, kept alive between requests: a request reuses an idle one instead of
paying a TCP connect, a new llama-server HTTP thread and the slow start of a fresh socket each time.

A connection comes back here only when its answer was read whole and llama-server did not say `Connection: close`
(cpp-httplib says it after an error status and on the last request it allows on one connection); any other end (a
client that left, a timeout, a cut answer, a drain) closes it, which is also what tells llama-server to stop
generating. The pool is bounded and an idle connection is closed before llama-server's own keep-alive timeout would
close it under a request; one that closed anyway is found on its next use and the request is sent again once on a
new connection (exchange.py), only while no byte of the answer has arrived.

A connection is its own asyncio protocol. Bytes are pulled (`read`) for heads and whole answers; during a streamed
answer they are pushed instead (`relay`) to a sink called from the socket's read callback, so that a token costs
one callback, not a future, a task step and a copy through a StreamReader.

llama-server may answer before it has read a request's body (a 401 to a keyless one) and close with the rest unread,
which makes its kernel reset the connection. The hop's next write of the body then fails, and asyncio's transport
(uvloop's too) closes on a failed write without reading what the kernel still holds, though Linux keeps what arrived
before a reset readable. Each connection therefore keeps a second descriptor of its socket, and when the connection
breaks with bytes unread, they are read from it before the break is seen: the client gets llama-server's answer, not
a 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import typing
from collections import deque

from gguf_serve.container.hop.channel import BUFFER_LIMIT, Channel

UPSTREAM_IDLE_S = 2.0  # under cpp-httplib's keep-alive timeout (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND, 5 s)
UPSTREAM_SPARE = 4  # idle connections kept beyond llama-server's slots: /metrics and requests queued for a slot
RESEND_MAX_BYTES = 1024 * 1024  # a request body up to this size is kept to send again; a larger one is not resent
LEFT_MAX_BYTES = 1024 * 1024  # what is read of a broken connection's unread bytes: an answer given before a reset


class Sink(typing.Protocol):
    """Where a relayed answer's bytes go, from the read callback."""

    def feed(self, data: bytes) -> None: ...

    def ended(self, error: BaseException | None) -> None:
        """llama-server closed (None) or the connection broke, before the sink let go."""


class UpstreamConnection(Channel):
    """One TCP connection to llama-server; `reused` once it has carried an answer before."""

    keep_open_at_eof = False  # llama-server never half-closes a connection it still answers on

    def __init__(self) -> None:
        super().__init__()
        self.reused = False
        self.idle_since = 0.0
        self._sink: Sink | None = None
        self._spare = -1  # a second descriptor of the socket, to read what a failed write left unread

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                self._spare = os.dup(sock.fileno())

    def connection_lost(self, exc: Exception | None) -> None:
        spare, self._spare = self._spare, -1
        if spare >= 0:
            try:
                if exc is not None and not self._eof:
                    self._read_what_is_left(spare)
            finally:
                os.close(spare)
        super().connection_lost(exc)

    def _read_what_is_left(self, fd: int) -> None:
        """The bytes the kernel holds for a connection the transport gave up on (a failed write): into the buffer
        or the sink, as if read before the break."""
        left = LEFT_MAX_BYTES
        while left > 0:
            try:
                data = os.read(fd, min(left, 65536))
            except OSError:  # nothing more (EAGAIN), or the reset itself once the data is read
                return
            if not data:
                return
            left -= len(data)
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink.feed(data)
        else:
            super().data_received(data)

    def relay(self, sink: Sink, first: bytes = b"") -> None:
        """From now on every read goes to `sink`, until `unrelay`: `first` (bytes already taken from this connection)
        and what had arrived after it go first."""
        self._sink = sink
        if self._read_paused:
            self.resume_reading()  # paused for a full buffer that the sink takes now; the sink may pause it again
        if self._pieces:
            first += self._take()
        if first:
            sink.feed(first)
        if self._eof and self._sink is sink:
            sink.ended(self._error)

    def unrelay(self) -> None:
        """Back to pulling; reading resumes if the sink paused it."""
        self._sink = None
        if self._read_paused and self._buffered <= BUFFER_LIMIT:
            self.resume_reading()

    def usable(self) -> bool:
        """Open both ways, nothing unread: llama-server has not closed it (EOF), reset it or sent something unasked."""
        transport = self.transport
        return not (transport is None or transport.is_closing() or self._eof or self._pieces)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()  # closing upstream cancels llama-server's task (is_connection_closed)

    def _ended(self, error: BaseException | None) -> None:
        first = not self._eof
        super()._ended(error)
        if first and self._sink is not None:
            self._sink.ended(error)


class UpstreamPool:
    """Idle connections to one llama-server, most recently used first; at most `size` kept."""

    def __init__(self, host: str, port: int, *, size: int, connect_timeout_s: float) -> None:
        self.host, self.port, self.size, self.connect_timeout_s = host, port, size, connect_timeout_s
        self._idle: deque[UpstreamConnection] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self.opened = 0  # new TCP connections since the start (the hop's /metrics does not show it; tests read it)

    def __len__(self) -> int:
        return len(self._idle)

    async def take(self, *, fresh: bool = False) -> UpstreamConnection:
        """An idle connection that is still open, else a new one (always a new one with `fresh`)."""
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        return await self.connect()

    async def connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        connecting = loop.create_connection(UpstreamConnection, self.host, self.port)
        _, conn = await asyncio.wait_for(connecting, self.connect_timeout_s)  # both loops set TCP_NODELAY on it
        self.opened += 1
        return conn

    def give_back(self, conn: UpstreamConnection) -> None:
        """A connection whose exchange ended cleanly: kept for the next request, or closed when the pool is full."""
        if len(self._idle) >= self.size or not conn.usable():
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(UPSTREAM_IDLE_S, self._close_idle)

    def _close_idle(self) -> None:
        """Close what has been idle UPSTREAM_IDLE_S (the oldest are at the left); look again while any are left."""
        self._sweep = None
        horizon = time.monotonic() - UPSTREAM_IDLE_S
        while self._idle and self._idle[0].idle_since <= horizon:
            self._idle.popleft().close()
        if self._idle:
            wait = self._idle[0].idle_since - horizon
            self._sweep = asyncio.get_running_loop().call_later(wait, self._close_idle)

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._idle:
            self._idle.pop().close()
