"""What the hop does with a request: answer it itself (a bad target, /health, a missing key, a drain, a full
queue) or admit it and forward it (exchange.py).

Admission: past `slots * (1 + queue_per_slot)` slot-taking requests in flight, the hop answers 429 with
Retry-After instead of queueing without bound; while draining, 503. GET /health is answered within
`health_timeout_s` whatever the load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import unquote

import h11

from gguf_serve.container.hop.auth import UNAUTHORIZED_BODY, UNAUTHORIZED_TYPE, needs_key
from gguf_serve.container.hop.client import READ_SIZE, ClientConnection, Hop, Refused, error_body, fields
from gguf_serve.container.hop.exchange import Exchange, Via, forwarded_headers
from gguf_serve.container.hop.metrics import RequestRecord
from gguf_serve.container.hop.models import LIST_ROUTES, MODEL_HEADER, MODEL_ROUTES

log = logging.getLogger("gguf-serve-hop")

GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/completion"}
)
# POST routes of llama-server (tools/server/server.cpp) that take a slot: these count against admission.
SLOT_PATHS = GENERATION_PATHS | frozenset(
    {"/v1/responses", "/responses", "/v1/messages", "/infill", "/embedding", "/embeddings", "/v1/embeddings",
     "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v1/audio/transcriptions", "/audio/transcriptions"}
)  # fmt: skip
HEALTH_ALIVE_S = 10.0  # upstream bytes this recent stand for a /health that llama-server did not answer in time


async def handle(conn: ClientConnection, request: h11.Request) -> None:
    """One request on a client connection, answered or forwarded; the admission books kept."""
    started = time.monotonic()
    conn.head_only = request.method == b"HEAD"
    server = conn.server
    try:
        request = server.rewrite(request)
        lowered = fields(request.headers)
        route, length, chunked = _check(conn, request, lowered)
    except Refused as e:
        await conn.refuse(e.status, e.message)
        return
    method = request.method.decode("ascii")
    if method == "GET" and route in ("/health", "/v1/health"):
        await _health(conn, request)
        return
    if conn.overflow:
        retry = [(b"retry-after", b"%d" % server.admission.retry_after_s)]
        await conn.refuse(503, f"the hop holds {conn.limits.max_connections} connections; retry", extra=retry)
        return
    has_body = chunked or bool(length)
    keyless = server.keys is not None and needs_key(request.method, route, has_body)
    if keyless and not server.keys.accepts(lowered):  # type: ignore[union-attr]
        server.metrics.unauthorized += 1  # answered here: no body read, no admission place, not shed
        await conn.reply(401, UNAUTHORIZED_BODY, UNAUTHORIZED_TYPE)
        return
    if server.models is not None and await _other_model(conn, request, route, length, chunked, lowered):
        return
    slot = method == "POST" and route in SLOT_PATHS
    measured = method == "POST" and route in GENERATION_PATHS
    record = RequestRecord(started) if measured else None
    if slot and server.drain is not None:  # leaving: another instance takes the retry
        server.drain.refused += 1
        server.metrics.drain_refused += 1
        reason = f"this instance is draining ({server.drain.reason}); retry, another instance will answer"
        await _refuse_slot(conn, 503, reason, record)
        return
    limit = server.admission.limit
    if slot and limit is not None and server.in_flight >= limit:
        server.metrics.shed += 1
        reason = f"llama-server has {server.in_flight} requests for {server.admission.slots} slots; retry later"
        await _refuse_slot(conn, 429, reason, record)
        return
    if slot:
        server.in_flight += 1
    exchange = Exchange(conn, request, route, chunked, record)
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


async def _other_model(
    conn: ClientConnection, request: h11.Request, route: str, length: int | None, chunked: bool,
    lowered: list[tuple[bytes, bytes]],
) -> bool:  # fmt: skip
    """Answer here what concerns the served names (models.py): True when answered (a model served elsewhere: 404
    model_not_found; GET /v1/models: the names)."""
    server = conn.server
    models = server.models
    assert models is not None
    if request.method == b"GET" and route in LIST_ROUTES:
        try:
            status, _, body = await asyncio.wait_for(
                _fetch(server, request, limit=1 << 20), conn.limits.health_timeout_s
            )
        except (TimeoutError, OSError, h11.ProtocolError):
            status, body = 0, b""
        await conn.reply(200, models.listing(body if status == 200 else b""))
        return True
    encoded = any(n == b"content-encoding" and v.strip().lower() != b"identity" for n, v in lowered)
    if request.method != b"POST" or route not in MODEL_ROUTES or chunked or not length or encoded:
        return False
    body = await conn.peek_body(length, conn.limits.body_deadline_s)
    if body is None:
        return False
    # Named by the shared load balancer's header already: it came to the fleet that serves it, or a loop ends here.
    routable = not any(n == MODEL_HEADER for n, _ in lowered)
    asked = models.asked(body)
    if routable and (to := models.route(asked)) is not None:
        await _route(conn, request, route, chunked, server.routes[to.model])
        return True
    refusal = models.refusal(body, routable=routable)
    if refusal is None:
        return False
    server.metrics.wrong_model += 1  # answered here: no admission place, not shed
    conn.take_buffered_body()  # read past the body: the connection is kept for the next request
    await conn.reply(404, refusal)
    return True


async def _route(conn: ClientConnection, request: h11.Request, route: str, chunked: bool, via: Via) -> None:
    """A request for a model another fleet behind the same endpoint serves, forwarded there (models.py), bounded:
    at most Limits.max_routed in flight, 503 while this instance drains; the serving fleet's hop counts the rest."""
    server = conn.server
    retry = [(b"retry-after", b"%d" % server.admission.retry_after_s)]
    if server.drain is not None:
        keep = conn.take_buffered_body()
        await conn.refuse(503, f"this instance is draining ({server.drain.reason}); retry", close=not keep, extra=retry)
        return
    if server.routed_in_flight >= conn.limits.max_routed:
        server.metrics.route_shed += 1
        keep = conn.take_buffered_body()
        reason = f"{server.routed_in_flight} requests are being forwarded to other models' fleets; retry later"
        await conn.refuse(429, reason, close=not keep, extra=retry)
        return
    server.metrics.routed += 1
    server.routed_in_flight += 1
    try:
        await Exchange(conn, request, route, chunked, None, via=via).run()
    finally:
        server.routed_in_flight -= 1


def _check(
    conn: ClientConnection, request: h11.Request, lowered: list[tuple[bytes, bytes]]
) -> tuple[str, int | None, bool]:
    """(route as llama-server matches it, Content-Length, chunked), or Refused for what is not forwarded."""
    target = request.target
    if not target.startswith(b"/"):
        raise Refused(400, "the request target must be a path (origin-form)")
    if request.http_version not in (b"1.0", b"1.1"):
        raise Refused(505, f"HTTP/{request.http_version.decode('ascii')} is not served here; use HTTP/1.1")
    lengths = [v for n, v in lowered if n == b"content-length"]
    chunked = any(n == b"transfer-encoding" for n, _ in lowered)
    if lengths and chunked:  # RFC 9112 6.1: a proxy must not forward such a request; llama-server reads both
        raise Refused(400, "Content-Length together with Transfer-Encoding")
    length = int(lengths[0]) if lengths else None  # h11 took digits only and equal duplicates as one
    most = conn.limits.max_body_bytes
    if length is not None and length > most:
        raise Refused(413, f"request body of {length} bytes; the hop takes at most {most}")
    # cpp-httplib routes on the part before '#' and '?', percent-decoded (decode_path_component)
    path = target.split(b"#", 1)[0].split(b"?", 1)[0].decode("latin-1")
    return unquote(path, errors="replace"), length, chunked


async def _refuse_slot(conn: ClientConnection, status: int, reason: str, record: RequestRecord | None) -> None:
    """A request that would take a slot, refused with Retry-After (503 draining, 429 over admission): counted
    in the request metrics, and the connection kept when its small body can be read past."""
    if record is not None:
        record.status = status
        conn.server.metrics.observe(record)
    keep = conn.take_buffered_body()  # a body still on its way is never waited for: the connection closes
    retry = [(b"retry-after", b"%d" % conn.server.admission.retry_after_s)]
    await conn.refuse(status, reason, close=not keep, extra=retry)


async def _health(conn: ClientConnection, request: h11.Request) -> None:
    """llama-server's own /health when it answers in time; otherwise an answer from what the hop saw."""
    server = conn.server
    if server.drain is not None:  # the target group's health check: stop choosing this instance
        await conn.reply(
            503,
            error_body(503, f"draining ({server.drain.reason})", "unavailable_error"),
            extra=[(b"retry-after", b"%d" % server.admission.retry_after_s)],
        )
        return
    try:
        status, headers, body = await asyncio.wait_for(
            _fetch(server, request, limit=65536), conn.limits.health_timeout_s
        )
    except (TimeoutError, OSError, h11.ProtocolError) as e:
        # Busy (a timeout) while bytes flow is alive; a refused or reset connection is llama-server gone.
        alive = isinstance(e, TimeoutError) and time.monotonic() - server.last_upstream_byte < HEALTH_ALIVE_S
        log.debug("upstream /health: %s; upstream %s", type(e).__name__, "streaming" if alive else "silent")
        if alive:  # busy answering others: the HTTP threads are taken, the model is loaded
            await conn.reply(200, b'{"status":"ok"}')
        else:
            await conn.reply(503, error_body(503, "llama-server did not answer /health", "unavailable_error"))
        return
    await conn.relay_whole(status, headers, body)


async def _fetch(server: Hop, request: h11.Request, *, limit: int) -> tuple[int, list, bytes]:
    """A bodiless request to llama-server with the caller's headers; the whole answer, up to `limit` bytes."""
    upstream = await server.upstream.connect()  # a new connection: a health check never waits on a kept one
    try:
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=READ_SIZE)
        headers = forwarded_headers(server, request, False, bodiless=True)
        head = h11.Request(method=request.method, target=request.target, headers=headers)
        upstream.write(up.send(head) + up.send(h11.EndOfMessage()))
        status, headers, body = 0, [], bytearray()
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                up.receive_data(await upstream.read())
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
        upstream.close()
