"""Which llama-server route a SageMaker invocation reaches: chat completions unless the custom attributes say.

`X-Amzn-SageMaker-Custom-Attributes: route=/v1/completions` (other `key=value` pairs beside it, separated by `;`
or `,`, are ignored) picks a route from ROUTES and nothing else: an IAM caller reaches only what is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf_serve.container.sagemaker.contract import CUSTOM_ATTRIBUTES_MAX

ROUTE_KEY = "route"


@dataclass(frozen=True)
class Route:
    method: bytes
    path: bytes


DEFAULT = "/v1/chat/completions"
# llama-server routes (tools/server/server.cpp) an invocation may select. POST routes take the invocation's body;
# GET routes (what is served, and its settings: the benchmark labels its results from them) ignore it.
ROUTES = {
    "/v1/chat/completions": Route(b"POST", b"/v1/chat/completions"),
    "/v1/completions": Route(b"POST", b"/v1/completions"),
    "/completion": Route(b"POST", b"/completion"),  # llama-server's native API: timings in every answer
    "/v1/embeddings": Route(b"POST", b"/v1/embeddings"),  # answers 501 unless the profile enables embeddings
    "/tokenize": Route(b"POST", b"/tokenize"),
    "/detokenize": Route(b"POST", b"/detokenize"),
    "/apply-template": Route(b"POST", b"/apply-template"),
    "/v1/models": Route(b"GET", b"/v1/models"),
    "/props": Route(b"GET", b"/props"),
}


class RouteRefused(ValueError):
    """A custom attribute naming a route this endpoint does not serve; the message says which it does."""


def select(custom_attributes: bytes | None) -> Route:
    """The route for an invocation with these custom attributes (None: the header was not sent)."""
    if not custom_attributes:
        return ROUTES[DEFAULT]
    if len(custom_attributes) > CUSTOM_ATTRIBUTES_MAX:
        raise RouteRefused(f"custom attributes over {CUSTOM_ATTRIBUTES_MAX} characters")
    text = custom_attributes.decode("latin-1")
    wanted = None
    for part in text.replace(",", ";").split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip().lower() == ROUTE_KEY:
            if wanted is not None:
                raise RouteRefused("custom attributes name more than one route; send one route=...")
            wanted = value.strip()
    if wanted is None:
        return ROUTES[DEFAULT]
    route = ROUTES.get(wanted)
    if route is None:
        raise RouteRefused(f"route {wanted[:80]!r} is not served here; use one of {', '.join(ROUTES)}")
    return route
