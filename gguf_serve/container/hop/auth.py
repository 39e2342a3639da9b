"""The API key at the hop: the keys llama-server accepts, and the check it makes, so that a request without the key
is answered at its head (no body read, no admission place, no shed count, nothing forwarded).

llama-server (tools/server/server-http.cpp, pinned build) takes `LLAMA_API_KEY` as a comma-separated list, reads the
credential from `Authorization` or, when that is empty, `X-Api-Key`, strips one leading "Bearer ", and compares it
whole; `/health` and `/v1/health` (and the web UI's GET assets) need no key, OPTIONS never does. The hop does the
same and answers llama-server's own 401, so a keyed client sees no difference and a keyless one costs nothing.

The instance rewrites the key file at every server start (a rotated key); the hop re-reads it when its size or
mtime changes, at most once per `recheck_s`, and keeps the last keys it read when the file is briefly empty.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("gguf-serve-hop")

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
KEYLESS_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS"})  # forwarded without a key: llama-server decides
BEARER = b"Bearer "
# llama-server's answer, byte for byte (nlohmann::json sorts keys; content type application/json; charset=utf-8)
UNAUTHORIZED_BODY = json.dumps(
    {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}, separators=(",", ":")
).encode()
UNAUTHORIZED_TYPE = b"application/json; charset=utf-8"


def parse_keys(text: str) -> tuple[bytes, ...]:
    """The keys of one LLAMA_API_KEY value: comma-separated, empty items dropped (llama-server's --api-key)."""
    return tuple(k.strip().encode() for k in text.split(",") if k.strip())


class ApiKeys:
    """The keys to accept: given, from an environment variable, or from an env file (`NAME=value` lines)."""

    def __init__(
        self,
        keys: Iterable[str] = (),
        *,
        env_file: Path | None = None,
        variable: str = "LLAMA_API_KEY",
        recheck_s: float = 1.0,
    ) -> None:
        self._keys = tuple(k.encode() for k in keys if k)
        self.env_file, self.variable, self.recheck_s = env_file, variable, recheck_s
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        if env_file is not None:
            self._reload(force=True)
            if not self._keys:
                raise ValueError(f"{env_file} has no {variable}=...: the hop would check no key; check the file")

    @classmethod
    def from_env(cls, variable: str, environ: dict[str, str] | None = None) -> ApiKeys:
        value = (environ if environ is not None else os.environ).get(variable, "")
        keys = parse_keys(value)
        if not keys:
            raise ValueError(f"{variable} is not set or empty: pass the variable llama-server reads its key from")
        return cls([k.decode() for k in keys], variable=variable)

    @property
    def keys(self) -> tuple[bytes, ...]:
        if self.env_file is not None and time.monotonic() - self._checked >= self.recheck_s:
            self._reload()
        return self._keys

    def accepts(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """The credential of a request (h11's lower-case header names) matches a key, as llama-server decides."""
        authorization = api_key = None
        for name, value in headers:
            if name == b"authorization" and authorization is None:
                authorization = value
            elif name == b"x-api-key" and api_key is None:
                api_key = value
        given = authorization or api_key or b""
        if given.startswith(BEARER):
            given = given[len(BEARER) :]
        found = False
        for key in self.keys:  # every key compared, in constant time each: no early exit to time
            found |= hmac.compare_digest(given, key)
        return found

    def _reload(self, *, force: bool = False) -> None:
        self._checked = time.monotonic()
        assert self.env_file is not None
        try:
            st = self.env_file.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if stamp == self._stamp and not force:
                return
            text = self.env_file.read_text()
        except OSError as e:
            if force:
                raise ValueError(f"cannot read the API key file {self.env_file}: {e.strerror}") from None
            log.warning("cannot re-read the API key file %s (%s); keeping the keys read before", self.env_file, e)
            return
        keys: tuple[bytes, ...] = ()
        for line in text.splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == self.variable:
                keys = parse_keys(value)
        if keys:  # an empty read (the file rewritten at this moment) keeps the last keys
            if self._stamp is not None and keys != self._keys:
                log.info("the API key in %s changed; checking the new one", self.env_file)
            self._keys, self._stamp = keys, stamp


# Bodiless GETs of llama-server's API (its /metrics, /slots, /props, the model list, every /v1/ and /api/ route): it
# asks them for the key like any other route (server-http.cpp: public are /health, /v1/health and the web UI's
# assets only), so the hop answers their 401 itself instead of forwarding a keyless caller's request (round 4).
KEYED_GET_ROUTES = ("/v1/", "/api/", "/metrics", "/slots", "/props", "/models", "/lora-adapters", "/tokenize")


def needs_key(method: bytes, route: str, has_body: bool) -> bool:
    """Whether llama-server would ask this request for the key and the hop may answer its 401 itself: anything but
    the public health routes, except bodiless GET/HEAD of the web UI's assets (public: forwarded) and OPTIONS."""
    if route in PUBLIC_PATHS or method == b"OPTIONS":
        return False
    if method in KEYLESS_METHODS and not has_body:
        return route.startswith(KEYED_GET_ROUTES)
    return True
