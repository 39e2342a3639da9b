"""A small, standard-library reader for the key/value header of a GGUF file.

The launcher uses it to refuse MTP speculative decoding on a file without MTP layers before llama-server
would exit on it. Only the metadata section is read (a few MB at most), never the tensor data.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

MAGIC = b"GGUF"

# GGUF value types (ggml/include/gguf.h)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALARS = {
    UINT8: "B",
    INT8: "b",
    UINT16: "H",
    INT16: "h",
    UINT32: "I",
    INT32: "i",
    FLOAT32: "f",
    BOOL: "?",
    UINT64: "Q",
    INT64: "q",
    FLOAT64: "d",
}
# Limits far above real files (a Qwen3.6 header: ~300k vocabulary strings, arrays one level deep, strings
# of kilobytes) so that a crafted header ends in GGUFError quickly and in little memory.
_MAX_STRING = 16 << 20  # bytes of one string that is read (longer ones inside skipped arrays are seeked over)
_MAX_DEPTH = 8  # arrays of arrays
_MAX_ITEMS = 4_000_000  # keys, array items and strings visited in one header
_MAX_KEYS = 1_000_000


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


class SkippedArray(NamedTuple):
    """An array longer than `max_array` (token lists): its item type and length, not its items."""

    item_type: int
    length: int


class _Reader:
    def __init__(self, f: BinaryIO, endian: str, size: int) -> None:
        self.f = f
        self.e = endian
        self.size = size
        self.items = 0

    def left(self) -> int:
        return self.size - self.f.tell()

    def count(self, n: int = 1) -> None:
        self.items += n
        if self.items > _MAX_ITEMS:
            raise GGUFError(f"more than {_MAX_ITEMS:,} metadata items: not a model header")

    def exact(self, n: int) -> bytes:
        if n > self.left():
            raise GGUFError("truncated GGUF header")
        b = self.f.read(n)
        if len(b) != n:
            raise GGUFError("truncated GGUF header")
        return b

    def skip(self, n: int) -> None:
        if n > self.left():
            raise GGUFError("truncated GGUF header")
        self.f.seek(n, 1)

    def scalar(self, vtype: int) -> Any:
        fmt = self.e + _SCALARS[vtype]
        return struct.unpack(fmt, self.exact(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(UINT64)
        if n > _MAX_STRING:
            raise GGUFError(f"implausible string length {n}")
        return self.exact(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, max_array: int, depth: int = 0) -> Any:
        self.count()
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            if depth >= _MAX_DEPTH:
                raise GGUFError(f"arrays nested deeper than {_MAX_DEPTH}")
            item_type = self.scalar(UINT32)
            count = self.scalar(UINT64)
            if count > max_array:
                self.skip_array(item_type, count, depth + 1)
                return SkippedArray(item_type, count)
            return [self.value(item_type, max_array, depth + 1) for _ in range(count)]
        raise GGUFError(f"unknown GGUF value type {vtype}")

    def skip_array(self, item_type: int, count: int, depth: int) -> None:
        if item_type in _SCALARS:
            self.skip(struct.calcsize(_SCALARS[item_type]) * count)
        elif item_type == STRING:
            if count * 8 > self.left():  # every string has at least its 8-byte length
                raise GGUFError(f"array of {count:,} strings is longer than the file")
            for _ in range(count):
                self.count()
                self.skip(self.scalar(UINT64))
        elif item_type == ARRAY:
            if count * 12 > self.left():  # every inner array has at least its type and length
                raise GGUFError(f"array of {count:,} arrays is longer than the file")
            for _ in range(count):
                self.value(item_type, 0, depth)
        else:
            raise GGUFError(f"unknown GGUF value type {item_type}")


def read_metadata(path: str | Path, *, max_array: int = 1024) -> dict[str, Any]:
    """Every key/value pair of a GGUF header, in file order.

    Arrays longer than `max_array` items (vocabularies, merges) come back as `SkippedArray`.
    Also returns the header fields as `GGUF.version` and `GGUF.tensor_count`, like the gguf package does.
    """
    with open(path, "rb", buffering=1 << 20) as f:
        return read_metadata_from(f, size=os.fstat(f.fileno()).st_size, max_array=max_array, label=str(path))


def read_metadata_from(f: BinaryIO, *, size: int, max_array: int = 1024, label: str = "GGUF") -> dict[str, Any]:
    """read_metadata over any seekable binary stream of `size` bytes (a local file, HTTP ranges)."""
    try:
        return _read_metadata(f, size, max_array, label)
    except (struct.error, OverflowError, RecursionError, MemoryError) as e:  # belt and braces: one error type out
        raise GGUFError(f"{label}: malformed GGUF header ({type(e).__name__})") from None


def _read_metadata(f: BinaryIO, size: int, max_array: int, label: str) -> dict[str, Any]:
    if f.read(4) != MAGIC:
        raise GGUFError(f"{label} is not a GGUF file (bad magic)")
    raw_version = f.read(4)
    if len(raw_version) != 4:
        raise GGUFError("truncated GGUF header")
    endian = "<"
    version = struct.unpack("<I", raw_version)[0]
    if version & 0xFFFF == 0:  # a big-endian file read as little-endian
        endian, version = ">", struct.unpack(">I", raw_version)[0]
    if version not in (2, 3):
        raise GGUFError(f"unsupported GGUF version {version}")
    r = _Reader(f, endian, size)
    tensor_count = r.scalar(UINT64)
    kv_count = r.scalar(UINT64)
    if kv_count > _MAX_KEYS:
        raise GGUFError(f"implausible key count {kv_count:,}")
    meta: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": kv_count}
    for _ in range(kv_count):
        key = r.string()
        meta[key] = r.value(r.scalar(UINT32), max_array)
    return meta


def architecture(meta: dict[str, Any]) -> str:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError("GGUF header has no general.architecture")
    return arch


def nextn_predict_layers(meta: dict[str, Any]) -> int:
    """`<arch>.nextn_predict_layers`: how many multi-token-prediction layers the file carries (0 if absent)."""
    value = meta.get(f"{architecture(meta)}.nextn_predict_layers", 0)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def has_mtp_layers(path: str | Path) -> bool:
    """True when the GGUF carries MTP layers, i.e. llama-server accepts `--spec-type draft-mtp` for it."""
    return nextn_predict_layers(read_metadata(path, max_array=0)) > 0


class GGUFSummary(NamedTuple):
    architecture: str
    nextn_predict_layers: int
    tensor_count: int

    @property
    def has_mtp_layers(self) -> bool:
        return self.nextn_predict_layers > 0


def summarize(path: str | Path) -> GGUFSummary:
    meta = read_metadata(path, max_array=0)
    return GGUFSummary(architecture(meta), nextn_predict_layers(meta), meta["GGUF.tensor_count"])
