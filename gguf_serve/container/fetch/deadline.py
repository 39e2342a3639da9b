"""A deadline on each response's status line and headers.

The socket's read timeout bounds one silent gap, not a whole read: a server that sends a header byte every
few seconds keeps every read inside it and the request open for ever. The body has a minimum rate
(`pace`); this bounds the part before the body. A timer shuts the socket when the headers have not
all arrived in time, and the request fails with a timeout that names the host and the deadline.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ReadTimeoutError

# urllib3 logs headers it cannot parse with a traceback; a deadline cut them on purpose, and the failure
# is reported once, in one line, by the caller.
logging.getLogger("urllib3.connection").setLevel(logging.ERROR)


class _HeaderDeadline:
    """Mixed into urllib3's connections: getresponse() must return within `header_deadline_s`."""

    header_deadline_s: float = 30.0

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            sock = getattr(self, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once

        timer = threading.Timer(self.header_deadline_s, expire)
        timer.daemon = True
        timer.start()
        try:
            response = super().getresponse(*args, **kwargs)  # type: ignore[misc]
        except Exception as e:
            if expired.is_set():
                raise self._late() from e
            raise
        finally:
            timer.cancel()
        if expired.is_set():  # the shut socket read as the end of the headers: a response cut short, not one
            response.close()
            raise self._late()
        return response

    def _late(self) -> ReadTimeoutError:
        host = f"{getattr(self, 'host', 'the server')}:{getattr(self, 'port', '')}".rstrip(":")
        message = f"{host} sent no complete response headers within {self.header_deadline_s:.0f} s"
        return ReadTimeoutError(None, host, message)  # type: ignore[arg-type]


def with_header_deadline(pool: urllib3.PoolManager, seconds: float) -> urllib3.PoolManager:
    """Make every connection `pool` opens from now on enforce the header deadline."""
    http = type("DeadlineHTTPConnection", (_HeaderDeadline, HTTPConnection), {"header_deadline_s": seconds})
    https = type("DeadlineHTTPSConnection", (_HeaderDeadline, HTTPSConnection), {"header_deadline_s": seconds})
    pool.pool_classes_by_scheme = {
        "http": type("DeadlineHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": http}),
        "https": type("DeadlineHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": https}),
    }
    return pool
