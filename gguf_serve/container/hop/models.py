"""The names this endpoint's model answers to, and what the hop does with a request that names another.

llama-server answers whatever `model` a request names with the one model it holds: a client that asks the
35B-A3B endpoint for "Qwen3.6-27B" would be served by the 35B-A3B without a word. With the names known (the runtime
spec's model name, llama-server's --alias, and the aliases the catalog lists), the hop answers a request that names
another model 404 `model_not_found` in OpenAI's shape, listing the names it serves, before it takes an admission
place; a request naming one of them, or none, is forwarded as before. `GET /v1/models` lists exactly those names.

What is read: a JSON body whose length is given (Content-Length), once it has all arrived (within the body limits
the hop already holds every client to). A chunked or compressed body is forwarded unread: llama-server then answers
it as before (OpenAI's clients send a length, uncompressed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# llama-server's routes that read `model` from a JSON body (tools/server/server.cpp); the others ignore it.
MODEL_ROUTES = frozenset(
    {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/responses", "/responses",
     "/v1/messages", "/v1/embeddings", "/embeddings", "/v1/rerank", "/rerank"}
)  # fmt: skip
LIST_ROUTES = frozenset({"/v1/models", "/models"})


@dataclass(frozen=True)
class ServedModels:
    names: tuple[str, ...]  # the first is llama-server's own (--alias)

    def __post_init__(self) -> None:
        if not self.names or any(not n.strip() for n in self.names):
            raise ValueError(f"served model names must be non-empty, got {self.names!r}")

    def refusal(self, body: bytes) -> bytes | None:
        """The 404 body for a request body that names a model served elsewhere; None to forward it (one of ours,
        no `model`, or not a JSON object: llama-server answers that as it always has)."""
        if b'"model"' not in body:
            return None
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        asked = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(asked, str) or not asked or asked in self.names:
            return None
        served = ", ".join(self.names)
        message = (f"The model '{asked[:200]}' is not served at this endpoint; it serves {served} "
                   "(GET /v1/models lists them). Send the request to the endpoint that serves that model.")  # fmt: skip
        error = {"message": message, "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
        return json.dumps({"error": error, "models": list(self.names)}).encode()

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
        return json.dumps({"object": "list", "data": [{**first, "id": name} for name in self.names]}).encode()
