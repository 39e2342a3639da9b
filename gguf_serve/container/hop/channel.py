"""One TCP connection as the hop reads and writes it, on either side: an asyncio protocol with its own buffer.

A read takes what has arrived, or waits for it with an optional timeout; bytes that arrive after a timeout or a
cancelled wait stay in the buffer for the next read, so nothing is lost and no task or asyncio.wait is needed per
read (a StreamReader read that must outlive its caller needs both). Reading pauses while more than BUFFER_LIMIT
bytes wait to be taken; a write waits (drain) while the socket's send buffer is over its high-water mark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

BUFFER_LIMIT = 2 * 65536  # bytes read and not yet taken beyond which reading pauses (StreamReader's 2 * limit)


class Channel(asyncio.Protocol):
    keep_open_at_eof = True  # after the peer's EOF the hop may still write (an answer, a refusal)

    def __init__(self, connected: Callable[[Channel], None] | None = None) -> None:
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self._connected = connected  # called once the transport is set
        self._pieces: list[bytes] = []  # read, not taken yet
        self._buffered = 0
        self._eof = False  # the peer closed its side, or the connection is gone
        self._lost = False
        self._error: BaseException | None = None  # why the connection broke
        self._waiter: asyncio.Future[None] | None = None  # a read() waiting for bytes
        self._drainer: asyncio.Future[None] | None = None  # a drain() waiting for the socket to take bytes
        self._write_paused = False
        self._read_paused = False
        self.on_end: Callable[[], None] | None = None  # called once when the peer closes or the connection breaks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self._connected is not None:
            self._connected(self)

    def data_received(self, data: bytes) -> None:
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > BUFFER_LIMIT and not self._read_paused:
            self.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._ended(None)
        return self.keep_open_at_eof

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._ended(exc)
        drainer, self._drainer = self._drainer, None
        if drainer is not None and not drainer.done():
            drainer.set_exception(exc or ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drainer, self._drainer = self._drainer, None
        if drainer is not None and not drainer.done():
            drainer.set_result(None)

    async def read(self, size: int | None = None, timeout: float | None = None) -> bytes:
        """Up to `size` bytes of what has arrived, waiting (TimeoutError after `timeout` s) while nothing has;
        b"" once the peer closed. Raises what broke the connection."""
        if not self._pieces and not self._eof:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if self._pieces:
            data = self._take(size)
            if self._read_paused and self._buffered <= BUFFER_LIMIT:
                self.resume_reading()
            return data
        if self._error is not None:
            raise self._error
        return b""

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark (one writer at a time)."""
        if self._lost or self.transport.is_closing():
            raise self._error or ConnectionResetError("connection lost")
        if self._write_paused:
            if self._drainer is None or self._drainer.done():
                self._drainer = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drainer)  # a caller's timeout leaves it to another waiter

    def pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._read_paused:
            self._read_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def _take(self, size: int | None = None) -> bytes:
        pieces, self._pieces, self._buffered = self._pieces, [], 0
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if size is not None and len(data) > size:
            data, rest = data[:size], data[size:]
            self._pieces, self._buffered = [rest], len(rest)
        return data

    @property
    def ended(self) -> bool:
        """The peer closed its side, or the connection is gone (what it sent before may still be unread)."""
        return self._eof

    def _ended(self, error: BaseException | None) -> None:
        if not self._eof:
            self._eof, self._error = True, error
            self._wake()
            on_end, self.on_end = self.on_end, None
            if on_end is not None:
                on_end()
        elif error is not None and self._error is None:
            self._error = error  # EOF first, then a reset

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
