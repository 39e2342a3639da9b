"""The hop: an asyncio HTTP/1.1 reverse proxy in front of llama-server, parsing both sides with h11.

One event loop serves every connection: an idle or half-sent connection costs a coroutine and a few KiB, not a
thread. Each client connection (client.py) reads requests with h11 and bounds what a client can hold: header,
body and idle timeouts, a body cap answered with 413, a connection cap that evicts the longest-idle connection
first (connections.py). Each request is answered at the hop or admitted (admission.py) and forwarded
(exchange.py): the body streams to llama-server piece by piece on a kept connection (upstream.py) and the answer
streams back the same way (relay.py, TCP_NODELAY), so that an SSE stream reaches the client token by token.
Headers, the Authorization header included, go upstream unchanged and are never logged: llama-server checks the
API key.

Admission: past `slots * (1 + queue_per_slot)` slot-taking requests in flight, the hop answers 429 with
Retry-After instead of queueing without bound. GET /health is answered within `health_timeout_s` whatever the
load; GET /metrics is llama-server's own /metrics (with the caller's key) followed by the hop's families.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from urllib.parse import urlsplit

import h11

from gguf_serve.container.hop import admission
from gguf_serve.container.hop import loop as hop_loop
from gguf_serve.container.hop.auth import ApiKeys
from gguf_serve.container.hop.channel import Channel
from gguf_serve.container.hop.client import ClientConnection, Refused, error_body
from gguf_serve.container.hop.connections import ConnectionTable
from gguf_serve.container.hop.drain import Drainer, DrainState
from gguf_serve.container.hop.exchange import Via
from gguf_serve.container.hop.gpu import GpuReader
from gguf_serve.container.hop.limits import Admission, Limits
from gguf_serve.container.hop.metrics import RequestMetrics
from gguf_serve.container.hop.models import MODEL_HEADER_NAME, ServedModels
from gguf_serve.container.hop.upstream import UPSTREAM_SPARE, UpstreamPool

__all__ = ["Admission", "Limits", "ProxyServer", "Refused", "error_body"]

log = logging.getLogger("gguf-serve-hop")


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
        gate: str = "",
        models: ServedModels | None = None,
    ) -> None:
        """keys: llama-server's API keys; a request without one is answered 401 at its head. gate: what else stands
        in front when there are none (SageMaker: IAM signs every InvokeEndpoint). One of the two is required: a hop
        never serves keyless by default (hostile input, round 4: a manifest without a key source once did)."""
        if keys is None and not gate.strip():
            raise ValueError(
                "no API key source: give --api-key-env-file or --api-key-env (the key llama-server checks), or, "
                "where another gate stands in front, say which with --no-api-key GATE"
            )
        self.gate = gate.strip()
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
        self.models = models  # the names this endpoint serves: a request naming another gets 404 (models.py)
        connect_s = self.limits.connect_timeout_s
        self.routes = {  # the models other fleets serve behind the same endpoint: their connections
            r.model: Via(UpstreamPool(r.host, r.port, size=UPSTREAM_SPARE * 4, connect_timeout_s=connect_s),
                         r.netloc, ((MODEL_HEADER_NAME.encode(), r.model.encode()),))
            for r in (models.routes if models else ())
        }  # fmt: skip
        self.routed_in_flight = 0
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
            hop_loop.run(self._serve())
        finally:
            self._finished.set()

    def wait_started(self, timeout: float) -> bool:
        """From another thread: True once serve_forever serves (its loop made, the listening socket on it)."""
        return self._started.wait(timeout)

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

    async def handle(self, conn: ClientConnection, request: h11.Request) -> None:
        """A request read on a client connection: answered here or forwarded (admission.py)."""
        await admission.handle(conn, request)

    def place(self, conn: ClientConnection, where: str) -> None:
        """Where a client connection is in the table (connections.py): whom to close first when it is full."""
        self._connections.place(conn, where)

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
        server = await self._loop.create_server(lambda: Channel(self._connected), sock=self._sock)
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

    def _connected(self, channel: Channel) -> None:
        """A new client connection: in the table (or refused), and a task that serves it."""
        transport = channel.transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # uvloop sets it on every TCP transport; asyncio not on an accepted one (its proto is 0)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = ClientConnection(self, channel)
        place = self._connections.admit(conn)
        if place is None:  # every connection is answering and the overflow is full: refuse rather than grow
            transport.abort()
            return
        conn.overflow = place == "overflow"
        conn.task = asyncio.get_running_loop().create_task(self._serve_connection(conn))

    async def _serve_connection(self, conn: ClientConnection) -> None:
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass  # closed for a newer connection, or the hop stops: the transport is gone already
        finally:
            self._connections.forget(conn)
