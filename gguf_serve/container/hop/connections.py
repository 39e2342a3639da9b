"""The hop's table of client connections: the real count, and whom to close when it is full.

A connection is in one of three places: `idle` (between requests, or its request head still arriving), `body` (its
request admitted and its body still arriving) or `busy` (its request whole: waiting for or streaming the answer).
When the table is full, the longest-idle connection is closed for the new one, then the longest-uploading one;
a connection whose answer is under way is never closed for another. A closed connection leaves the table at once,
not when its task next runs: under a burst of thousands of connects, the count stays the real one.
When nothing can be closed, a few connections more (`overflow`) are let in to answer GET /health only, so that a
full table never makes the load balancer's check fail; past those, a new connection is closed unanswered.
"""

from __future__ import annotations

from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


IDLE, BODY, BUSY = "idle", "body", "busy"


class ConnectionTable:
    def __init__(self, limit: int, overflow: int) -> None:
        self.limit, self.overflow_limit = limit, overflow
        self._all: dict[Closable, None] = {}  # insertion order: the oldest first
        self._idle: dict[Closable, None] = {}  # ordered by when each became idle
        self._body: dict[Closable, None] = {}
        self.overflow: set[Closable] = set()
        self.evicted = 0  # connections closed to make room, since the start

    def __len__(self) -> int:
        return len(self._all) + len(self.overflow)

    def __iter__(self):
        return iter([*self._all, *self.overflow])

    def admit(self, conn: Closable) -> str | None:
        """Take a new connection: "table", "overflow" (health checks only), or None (close it unanswered)."""
        if len(self._all) >= self.limit and not self._evict():
            if len(self.overflow) >= self.overflow_limit:
                return None
            self.overflow.add(conn)
            return "overflow"
        self._all[conn] = None
        self._idle[conn] = None
        return "table"

    def place(self, conn: Closable, where: str) -> None:
        if conn not in self._all:
            return  # an overflow connection, or one closed already
        self._idle.pop(conn, None)
        self._body.pop(conn, None)
        if where == IDLE:
            self._idle[conn] = None
        elif where == BODY:
            self._body[conn] = None

    def forget(self, conn: Closable) -> None:
        for table in (self._all, self._idle, self._body):
            table.pop(conn, None)
        self.overflow.discard(conn)

    def _evict(self) -> bool:
        for table in (self._idle, self._body):
            if table:
                conn = next(iter(table))
                self.forget(conn)
                conn.close()
                self.evicted += 1
                return True
        return False
