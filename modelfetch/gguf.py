"""A small, standard-library reader for the key/value header of a GGUF file.

The launcher uses it to refuse MTP speculative decoding on a file without MTP layers before llama-server
would exit on it. Only the metadata section is read (a few MB at most), never the tensor data.
"""

from __future__ import annotations

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
_MAX_STRING = 1 << 30  # a corrupt length must not make us allocate gigabytes


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


class SkippedArray(NamedTuple):
    """An array longer than `max_array` (token lists): its item type and length, not its items."""

    item_type: int
    length: int


class _Reader:
    def __init__(self, f: BinaryIO, endian: str) -> None:
        self.f = f
        self.e = endian

    def exact(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise GGUFError("truncated GGUF header")
        return b

    def scalar(self, vtype: int) -> Any:
        fmt = self.e + _SCALARS[vtype]
        return struct.unpack(fmt, self.exact(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(UINT64)
        if n > _MAX_STRING:
            raise GGUFError(f"implausible string length {n}")
        return self.exact(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, max_array: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item_type = self.scalar(UINT32)
            count = self.scalar(UINT64)
            if count > max_array:
                self.skip_array(item_type, count)
                return SkippedArray(item_type, count)
            return [self.value(item_type, max_array) for _ in range(count)]
        raise GGUFError(f"unknown GGUF value type {vtype}")

    def skip_array(self, item_type: int, count: int) -> None:
        if item_type in _SCALARS:
            self.f.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
        elif item_type == STRING:
            for _ in range(count):
                n = self.scalar(UINT64)
                if n > _MAX_STRING:
                    raise GGUFError(f"implausible string length {n}")
                self.f.seek(n, 1)
        else:
            for _ in range(count):
                self.value(item_type, 0)


def read_metadata(path: str | Path, *, max_array: int = 1024) -> dict[str, Any]:
    """Every key/value pair of a GGUF header, in file order.

    Arrays longer than `max_array` items (vocabularies, merges) come back as `SkippedArray`.
    Also returns the header fields as `GGUF.version` and `GGUF.tensor_count`, like the gguf package does.
    """
    with open(path, "rb", buffering=1 << 20) as f:
        if f.read(4) != MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (bad magic)")
        raw_version = f.read(4)
        if len(raw_version) != 4:
            raise GGUFError("truncated GGUF header")
        endian = "<"
        version = struct.unpack("<I", raw_version)[0]
        if version & 0xFFFF == 0:  # a big-endian file read as little-endian
            endian, version = ">", struct.unpack(">I", raw_version)[0]
        if version not in (2, 3):
            raise GGUFError(f"unsupported GGUF version {version}")
        r = _Reader(f, endian)
        tensor_count = r.scalar(UINT64)
        kv_count = r.scalar(UINT64)
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
    return int(value) if isinstance(value, int) else 0


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
