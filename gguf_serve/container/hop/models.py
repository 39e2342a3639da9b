"""The names this endpoint's model answers to, and what the hop does with a request that names another.

llama-server answers whatever `model` a request names with the one model it holds: a client that asks the
35B-A3B endpoint for "Qwen3.6-27B" would be served by the 35B-A3B without a word. With the names known (the runtime
spec's model name, llama-server's --alias, and the aliases the catalog lists), the hop answers a request that names
another model 404 `model_not_found` in OpenAI's shape, listing the names it serves, before it takes an admission
place; a request naming one of them, or none, is forwarded as before. `GET /v1/models` lists exactly those names.

One endpoint for several models (`routes`): a request naming a model another fleet serves is forwarded to that
fleet's address with `X-Gateway-Model-Name: <model>` (the header the shared load balancer's rule for that fleet
matches, as in the Gateway API inference extension), bounded like any request here (its limits and timeouts, and at
most `Limits.max_routed` in flight: past them 429 with Retry-After); the fleet that serves it counts it (its
admission, its histograms, its output tokens): this hop counts it routed. A request that already carries the header
is never forwarded again (a loop ends in a 404), and `GET /v1/models` lists every name behind the endpoint.

What is read: a JSON body whose length is given (Content-Length), once it has all arrived (within the body limits
the hop already holds every client to). A chunked or compressed body is forwarded unread: llama-server then answers
it as before (OpenAI's clients send a length, uncompressed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# llama-server's routes that read `model` from a JSON body (tools/server/server.cpp); the others ignore it.
MODEL_ROUTES = frozenset(
    {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/responses", "/responses",
     "/v1/messages", "/v1/embeddings", "/embeddings", "/v1/rerank", "/rerank"}
)  # fmt: skip
LIST_ROUTES = frozenset({"/v1/models", "/models"})
MODEL_HEADER_NAME = "X-Gateway-Model-Name"  # the Gateway API inference extension's; the shared ALB's rules match it
MODEL_HEADER = MODEL_HEADER_NAME.lower().encode()  # as the hop reads request heads


@dataclass(frozen=True)
class Route:
    """Where a model this endpoint does not serve is: an http:// address (the shared load balancer's)."""

    model: str
    url: str

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"route {self.model}={self.url}: the address must be http://host[:port]")

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 80

    @property
    def netloc(self) -> str:
        return urlsplit(self.url).netloc


def parse_route(text: str) -> Route:
    """NAME=http://host:port (--route)."""
    name, sep, url = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--route {text!r}: give NAME=http://host:port")
    return Route(name.strip(), url.strip())


@dataclass(frozen=True)
class ServedModels:
    names: tuple[str, ...]  # the first is llama-server's own (--alias)
    routes: tuple[Route, ...] = field(default=())  # the models other fleets behind the same endpoint serve

    def __post_init__(self) -> None:
        if not self.names or any(not n.strip() for n in self.names):
            raise ValueError(f"served model names must be non-empty, got {self.names!r}")
        if overlap := set(self.names) & {r.model for r in self.routes}:
            raise ValueError(f"{', '.join(sorted(overlap))}: served here and routed elsewhere; give one or the other")

    @property
    def everywhere(self) -> tuple[str, ...]:
        """Every name behind this endpoint: its own, then the routed ones."""
        return tuple(dict.fromkeys((*self.names, *(r.model for r in self.routes))))

    def asked(self, body: bytes) -> str | None:
        """The `model` a JSON object body names; None for none, or a body llama-server answers as it always has."""
        if b'"model"' not in body:
            return None
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        asked = doc.get("model") if isinstance(doc, dict) else None
        return asked if isinstance(asked, str) and asked else None

    def route(self, asked: str | None) -> Route | None:
        return next((r for r in self.routes if r.model == asked), None)

    def refusal(self, body: bytes, *, routable: bool = True) -> bytes | None:
        """The 404 body for a request body that names a model not behind this endpoint (or, with `routable` False,
        not served here); None to forward it (one of ours, no `model`, or not a JSON object)."""
        asked = self.asked(body)
        if asked is None or asked in self.names or (routable and self.route(asked) is not None):
            return None
        known = self.everywhere if routable else self.names
        message = (f"The model '{asked[:200]}' is not served at this endpoint; it serves {', '.join(known)} "
                   "(GET /v1/models lists them). Send the request to the endpoint that serves that model.")  # fmt: skip
        error = {"message": message, "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
        return json.dumps({"error": error, "models": list(known)}).encode()

    def listing(self, upstream: bytes) -> bytes:
        """llama-server's /v1/models answer with one entry per served name (its own entry's fields, the id
        changed); when that answer is not what llama-server writes, a plain OpenAI list."""
        try:
            doc = json.loads(upstream)
            first = doc["data"][0]
            if not isinstance(first, dict):
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):
            first = {"object": "model", "owned_by": "llamacpp"}
        own = [{**first, "id": name} for name in self.names]
        routed = [{"id": r.model, "object": "model", "owned_by": "llamacpp"} for r in self.routes]
        return json.dumps({"object": "list", "data": own + routed}).encode()
