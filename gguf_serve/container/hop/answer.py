"""A request framed for llama-server, and its answer read back as h11 events, without h11 for the shapes llama-server
writes.

h11 validated and framed every request twice (the client's, then the copy for llama-server) and parsed every answer
through its state machine: most of the hop's cost per request. The request the hop forwards was parsed and checked
by h11 on the client's side already, so it is framed here as h11 frames it (request line, Host first, the fields
as they came, the body chunked or as is). An answer head of the shape cpp-httplib writes (HTTP/1.1, a final
status, token field names, clean values, one Content-Length or `Transfer-Encoding: chunked`) is parsed here with
the same checks as h11's parser; any other head, and an end before a whole head, goes to a real h11 connection
with the same bytes, so that h11 answers (or refuses) it as it always did.
"""

from __future__ import annotations

import re

import h11

from gguf_serve.container.hop.chunked import ChunkedDecoder, ChunkedError

_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_VALUE = bytes([9, *range(32, 127), *range(128, 256)])  # a field value's bytes (RFC 9110 5.5), spaces inside
_REASON = _VALUE
_DIGITS = b"0123456789"
MAX_LENGTH_DIGITS = 20  # h11's bound on a Content-Length value
_BARE_END = re.compile(rb"\n\r?\n")  # where h11 also ends a head (it accepts bare LF line ends)
HEAD, LENGTH, CHUNKED, DONE, H11 = range(5)


def frame_request(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request head as h11 frames it for HTTP/1.1: the request line, Host first, then the fields in order."""
    host = [b"%b: %b\r\n" % (n, v) for n, v in headers if n.lower() == b"host"]
    rest = [b"%b: %b\r\n" % (n, v) for n, v in headers if n.lower() != b"host"]
    return b"%b %b HTTP/1.1\r\n%b%b\r\n" % (method, target, b"".join(host), b"".join(rest))


def frame_chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data) if data else b""


LAST_CHUNK = b"0\r\n\r\n"


class AnswerReader:
    """llama-server's answer to one request as h11.Connection(h11.CLIENT) gives it: next_event, receive_data and
    trailing_data, for a request whose method is `method`."""

    __slots__ = ("_buf", "_closed", "_decoder", "_h11", "_left", "_limit", "_method", "_state")

    def __init__(self, method: bytes, *, limit: int) -> None:
        self._method, self._limit = method, limit  # limit: the longest head, as h11's max_incomplete_event_size
        self._buf = b""
        self._closed = False
        self._state = HEAD
        self._left = 0  # Content-Length bytes still to come
        self._decoder: ChunkedDecoder | None = None
        self._h11: h11.Connection | None = None

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        if self._h11 is not None:
            return self._h11.trailing_data
        return self._buf, self._closed

    def receive_data(self, data: bytes) -> None:
        if self._h11 is not None:
            self._h11.receive_data(data)
        elif data:
            self._buf = self._buf + data if self._buf else data
        else:
            self._closed = True

    def next_event(self) -> h11.Event | type[h11.NEED_DATA]:
        state = self._state
        if state == HEAD:
            return self._head()
        if state == H11:
            return self._h11.next_event()  # type: ignore[union-attr]
        buf = self._buf
        if state == LENGTH:
            if not self._left:
                self._state = DONE
                return h11.EndOfMessage()
            if not buf:
                return self._need_data()
            data, self._buf = (buf, b"") if len(buf) <= self._left else (buf[: self._left], buf[self._left :])
            self._left -= len(data)
            return h11.Data(data=data)
        if state == CHUNKED:
            decoder = self._decoder
            assert decoder is not None
            if decoder.done:
                self._state = DONE
                return h11.EndOfMessage()
            if not buf:
                return self._need_data()
            try:
                payload, self._buf = decoder.feed(buf, strict=False), decoder.rest
            except ChunkedError as e:
                raise h11.RemoteProtocolError(str(e)) from None
            decoder.rest = b""
            if payload:
                return h11.Data(data=payload)
            return self.next_event()
        return h11.PAUSED if buf else h11.NEED_DATA  # DONE: what follows the answer is trailing data

    def _need_data(self) -> type[h11.NEED_DATA]:
        """More of the body is needed: NEED_DATA, or h11's error when llama-server has closed."""
        if self._closed:
            raise h11.RemoteProtocolError("peer closed connection without sending complete message body")
        return h11.NEED_DATA

    def _head(self) -> h11.Event | type[h11.NEED_DATA]:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end == -1:
            if self._closed or len(buf) > self._limit or _BARE_END.search(buf):
                return self._to_h11()  # h11 says what is wrong with it (a cut head, a head too long, bare LFs)
            return h11.NEED_DATA
        response = self._parse(buf[:end]) if end <= self._limit else None
        if response is None:
            return self._to_h11()
        self._buf = buf[end + 4 :]
        return response

    def _parse(self, head: bytes) -> h11.Response | None:
        """The head when it is of the shape llama-server writes, checked as h11 checks it; else None."""
        lines = head.split(b"\r\n")
        status = lines[0]
        if len(status) < 12 or status[:9] != b"HTTP/1.1 " or status[12:13] not in (b" ", b""):
            return None
        code = status[9:12]
        if code.translate(None, _DIGITS) or code[0] in b"01" or status[13:].translate(None, _REASON):
            return None
        code_n = int(code)
        if code_n in (204, 304) or self._method in (b"HEAD", b"CONNECT"):
            return None  # no body whatever the fields say: h11's framing rules
        fields: list[tuple[bytes, bytes]] = []
        length: bytes | None = None
        chunked = False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name.translate(None, _TOKEN):
                return None
            value = value.strip(b" \t")
            if value.translate(None, _VALUE):
                return None
            lower = name.lower()
            if lower == b"content-length":
                if length is not None or not value or value.translate(None, _DIGITS):
                    return None
                if len(value) > MAX_LENGTH_DIGITS:
                    return None
                length = value
            elif lower == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    return None
                chunked = True
            fields.append((name, value))
        if chunked == (length is not None):
            return None  # both (h11 refuses) or neither (a body to the close): h11's
        if chunked:
            self._state, self._decoder = CHUNKED, ChunkedDecoder()
        else:
            self._state, self._left = LENGTH, int(length)  # type: ignore[arg-type]
        # _parsed: checked above as h11's parser checks a field (h11 would run its regexes once more)
        return h11.Response(status_code=code_n, headers=fields, reason=status[13:], http_version=b"1.1", _parsed=True)

    def _to_h11(self) -> h11.Event | type[h11.NEED_DATA]:
        """From here a real h11 connection reads the answer, as if it had sent the request itself."""
        up = self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=self._limit)
        up.send(h11.Request(method=self._method, target=b"/", headers=[(b"host", b"llama-server")]))
        up.send(h11.EndOfMessage())
        self._state = H11
        if self._buf:
            up.receive_data(self._buf)
        if self._closed:
            up.receive_data(b"")
        self._buf = b""
        return up.next_event()
