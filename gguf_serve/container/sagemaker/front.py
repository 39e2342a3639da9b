"""The SageMaker front: the hop (gguf_serve/container/hop/proxy.py) with SageMaker's two routes mapped onto
llama-server's.

GET /ping is llama-server's /health as the hop answers it (503 until the model is loaded and while draining, within
the hop's health timeout whatever the load); POST /invocations is the route the custom attributes select
(routes.py), streamed back chunk by chunk when the body asks for a stream. Everything else the hop does stays:
admission (429 past the profile's queue), the request histograms, the drain's books. Nothing else is served.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

import h11

from gguf_serve.container.hop.proxy import ProxyServer, Refused
from gguf_serve.container.sagemaker import routes
from gguf_serve.container.sagemaker.contract import CUSTOM_ATTRIBUTES, INVOCATIONS, PING

T = TypeVar("T")
HEALTH = b"/health"  # llama-server's; also what the image's HEALTHCHECK asks for


class SageMakerFront(ProxyServer):
    def rewrite(self, request: h11.Request) -> h11.Request:
        path = request.target.split(b"?", 1)[0]
        if path in (PING.encode(), HEALTH) and request.method in (b"GET", b"HEAD"):
            return h11.Request(method=request.method, target=HEALTH, headers=list(request.headers.raw_items()))
        if path == INVOCATIONS.encode() and request.method == b"POST":
            attributes = next((v for n, v in request.headers if n == CUSTOM_ATTRIBUTES.encode()), None)
            try:
                route = routes.select(attributes)
            except routes.RouteRefused as e:
                raise Refused(400, str(e)) from None
            return h11.Request(method=route.method, target=route.path, headers=list(request.headers.raw_items()))
        raise Refused(404, f"this endpoint serves GET {PING} and POST {INVOCATIONS} only")

    def call(self, fn: Callable[[], T], timeout: float = 5.0) -> T:
        """Run `fn` on the front's event loop (begin_drain, end_drain and the books live there) and return it."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the front is not serving yet")

        async def run() -> T:
            return fn()

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(run(), loop)
        return future.result(timeout)
