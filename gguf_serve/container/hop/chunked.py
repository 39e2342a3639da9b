"""An incremental decoder for an HTTP/1.1 chunked body (RFC 9112 7.1), for the hop's streaming path.

h11 decodes a body into one event per piece through its state machine; on an SSE stream that is one event per
token, and the hop paid for it on every token. This decoder takes whatever bytes arrived and returns the payload
they complete, joined, in one call: a read that holds ten tokens costs one call and one write to the client.
It is as strict as h11 on what it accepts (hex sizes, CRLF line ends, bounded lines) and drops chunk extensions
and trailers, which the hop never forwards.
"""

from __future__ import annotations

MAX_LINE = 4096  # a chunk-size line or a trailer field; h11 bounds the same lines
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


class ChunkedError(ValueError):
    """The bytes are not a chunked body."""


class ChunkedDecoder:
    """feed(data) -> the payload bytes `data` completes; `done` once the last chunk and trailers are in."""

    __slots__ = ("_left", "_line", "_state", "between", "done", "rest")

    def __init__(self) -> None:
        self._state = 0  # 0: size line, 1: chunk data, 2: CRLF after data, 3: trailer lines
        self._left = 0  # bytes of chunk data still to come
        self._line = b""  # an incomplete line
        self.between = True  # between two chunks: the next byte starts a chunk's size line
        self.done = False
        self.rest = b""  # with feed(strict=False): the bytes after the body's end

    def one_chunk(self, data: bytes) -> bytes | None:
        """The payload when `data` is exactly one whole chunk (not the last) between two chunks, as llama-server
        sends each token; else None and nothing consumed (then `feed`). Such `data` is valid chunk framing as is."""
        if self._state or self._line:
            return None
        nl = data.find(b"\n", 0, 18)
        if nl < 2 or data[nl - 1] != 13 or not HEX_DIGITS.issuperset(size := data[: nl - 1]):
            return None
        end = nl + 1 + int(size, 16)
        return data[nl + 1 : end] if end > nl + 1 and data[end:] == b"\r\n" else None

    def feed(self, data: bytes, *, strict: bool = True) -> bytes:
        """The payload `data` completes. Bytes after the body's end raise, or with strict=False are kept in `rest`."""
        out: list[bytes] = []
        pos, end = 0, len(data)
        self.between = False  # until this read is taken whole (a bad one leaves it False)
        while pos < end and not self.done:
            state = self._state
            if state == 1:
                take = min(self._left, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._state = 2
                continue
            line, pos = self._read_line(data, pos)
            if line is None:
                break
            if state == 0:
                self._left = _chunk_size(line)
                self._state = 1 if self._left else 3
            elif state == 2:
                if line:
                    raise ChunkedError("chunk data longer than its size")
                self._state = 0
            elif not line:  # state 3: the empty line after the trailers ends the body
                self.done = True
        self.between = not self._state and not self._line
        if pos < end and self.done:
            if strict:
                raise ChunkedError("bytes after the end of a chunked body")
            self.rest = data[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _read_line(self, data: bytes, pos: int) -> tuple[bytes | None, int]:
        """The next CRLF-terminated line from `pos` (without the CRLF), or None when it is not complete yet."""
        nl = data.find(b"\n", pos)
        if nl == -1:
            self._line += data[pos:]
            if len(self._line) > MAX_LINE:
                raise ChunkedError("a chunk line over the limit")
            return None, len(data)
        line = self._line + data[pos:nl] if self._line else data[pos:nl]
        self._line = b""
        if not line.endswith(b"\r") or len(line) > MAX_LINE:
            raise ChunkedError("a chunk line without CRLF or over the limit")
        return line[:-1], nl + 1


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", 1)[0].rstrip(b" \t")
    if not size or len(size) > 16 or not HEX_DIGITS.issuperset(size):
        raise ChunkedError(f"bad chunk size line {line[:40]!r}")
    return int(size, 16)
