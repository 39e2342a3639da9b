"""Any GGUF header ends in metadata or GGUFError, quickly and in little memory (the launcher then exits 78)."""

from __future__ import annotations

import contextlib
import struct
import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gguf_serve.container.fetch.gguf import GGUFError, read_metadata, summarize

MEMORY_LIMIT = 64 * 1024 * 1024  # bytes allocated while reading one header
U64 = st.one_of(st.integers(0, 64), st.sampled_from([2**31, 2**32 - 1, 2**40, 2**62, 2**63, 2**64 - 1]))
VTYPE = st.integers(0, 14)


def _value(draw: st.DrawFn, depth: int) -> bytes:
    vtype = draw(VTYPE)
    out = struct.pack("<I", vtype)
    if vtype == 8:  # string
        out += struct.pack("<Q", draw(U64)) + draw(st.binary(max_size=16))
    elif vtype == 9 and depth < 12:  # array, possibly of arrays
        item = draw(VTYPE)
        count = draw(U64)
        out = struct.pack("<I", 9) + struct.pack("<IQ", item, count)
        for _ in range(min(count, 3)):
            out += _value(draw, depth + 1)[4:] if item == 9 else draw(st.binary(max_size=16))
    else:
        out += draw(st.binary(max_size=8))
    return out


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    """Mostly well-formed GGUF framing with hostile counts, lengths, types and nesting."""
    version = draw(st.sampled_from([2, 3, 3 << 24, 0, 4]))
    kv_count = draw(U64)
    body = b""
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.binary(max_size=24))
        body += struct.pack("<Q", draw(st.sampled_from([len(key), len(key), 2**63]))) + key + _value(draw, 0)
    if draw(st.booleans()):  # the deep-nesting attack: arrays of arrays far past any real file
        body += _nest(draw(st.integers(1, 20_000)))
    tail = draw(st.binary(max_size=64))
    return b"GGUF" + struct.pack("<I", version) + struct.pack("<QQ", draw(U64), kv_count) + body + tail


def _nest(levels: int) -> bytes:
    return struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * levels


def _read(data: bytes) -> None:
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        tracemalloc.start()
        try:
            for max_array in (0, 1024):
                with contextlib.suppress(GGUFError):
                    read_metadata(f.name, max_array=max_array)
            with contextlib.suppress(GGUFError):
                summarize(Path(f.name))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"{peak} bytes for a {len(data)}-byte file"


@given(headers())
def test_crafted_headers_end_in_a_clean_refusal(data: bytes) -> None:
    _read(data)


@given(st.binary(max_size=512))
def test_random_bytes_after_the_magic_end_in_a_clean_refusal(data: bytes) -> None:
    _read(b"GGUF" + data)
