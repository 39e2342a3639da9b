"""The hop's connections to llama-server, kept alive between requests: a request reuses an idle one instead of
paying a TCP connect, a new llama-server HTTP thread and the slow start of a fresh socket each time.

A connection comes back here only when its answer was read whole and llama-server did not say `Connection: close`
(cpp-httplib says it after an error status and on the last request it allows on one connection); any other end (a
client that left, a timeout, a cut answer, a drain) closes it, which is also what tells llama-server to stop
generating. The pool is bounded and an idle connection is closed before llama-server's own keep-alive timeout would
close it under a request; one that closed anyway is found on its next use and the request is sent again once on a
new connection (proxy.py), only while no byte of the answer has arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque

UPSTREAM_IDLE_S = 2.0  # under cpp-httplib's keep-alive timeout (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND, 5 s)
UPSTREAM_SPARE = 4  # idle connections kept beyond llama-server's slots: /metrics and requests queued for a slot
RESEND_MAX_BYTES = 1024 * 1024  # a request body up to this size is kept to send again; a larger one is not resent
READ_SIZE = 65536


class UpstreamConnection:
    """One TCP connection to llama-server; `reused` once it has carried an answer before."""

    __slots__ = ("idle_since", "reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reused = False
        self.idle_since = 0.0

    def usable(self) -> bool:
        """Open both ways, nothing unread: llama-server has not closed it (EOF) or reset it."""
        return not (self.writer.transport.is_closing() or self.reader.at_eof() or self.reader.exception())

    def close(self) -> None:
        self.writer.transport.abort()  # closing upstream cancels llama-server's task (is_connection_closed)


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
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=READ_SIZE), self.connect_timeout_s
        )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return UpstreamConnection(reader, writer)

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
