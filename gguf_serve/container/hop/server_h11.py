"""h11's server side for the hop's client connections, with one cost taken out of every streamed answer.

Sending a Response, h11 (0.16, pinned) first fixes its framing fields (`_clean_up_response_headers_for_sending`):
for an answer of unknown length to an HTTP/1.1 client it drops Content-Length, adds `Transfer-Encoding: chunked`,
and each of those two steps and the final Response runs every field through h11's validation regexes again, though
they were checked once already, where the Response was made (or parsed from llama-server's bytes). That was about
6% of the hop's CPU per request. Here that one shape, a keep-alive HTTP/1.1 exchange whose answer carries none of
the framing fields (Content-Length, Transfer-Encoding, Connection), gets the same result in one step; every other
answer goes through h11's own code. tests/container/hop/test_server_h11.py holds both to the same bytes and states.
"""

from __future__ import annotations

import h11

_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})
_NO_BODY_STATUS = frozenset({204, 304})


class ServerH11(h11.Connection):
    """h11.Connection(h11.SERVER) for a client connection."""

    def __init__(self, *, max_incomplete_event_size: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_incomplete_event_size)

    def _clean_up_response_headers_for_sending(self, response: h11.Response) -> h11.Response:
        items = response.headers._full_items  # (raw name, lower-case name, value), as h11 keeps them
        if (
            type(response) is h11.Response
            and response.status_code >= 200
            and response.status_code not in _NO_BODY_STATUS
            and self._request_method not in (b"HEAD", b"CONNECT")
            and self.their_http_version == b"1.1"
            and self._cstate.keep_alive
            and not any(name in _FRAMING for _, name, _ in items)
        ):
            # What h11 makes of it: the fields as they are, then Transfer-Encoding: chunked (set_comma_header
            # appends the name title-cased); `_parsed`: these fields were validated when `response` was made.
            headers = [(raw, value) for raw, _, value in items]
            headers.append((b"Transfer-Encoding", b"chunked"))
            return h11.Response(
                headers=headers,
                status_code=response.status_code,
                http_version=response.http_version,
                reason=response.reason,
                _parsed=True,
            )
        return super()._clean_up_response_headers_for_sending(response)
