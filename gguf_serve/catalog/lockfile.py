"""The model lock file: pinned facts per model (revision, size, sha256, GGUF header), read and written as TOML.

`gguf-serve-catalog lock <model>` writes an entry from ModelScope's listing and the file's own header
(`locked_from = "listing"`). An entry nobody could lock yet says `locked_from = "typed"` and where each number
comes from in `source`. The catalog computes memory fit and the MTP check from these facts.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.model_facts import check_ceilings
from gguf_serve.catalog.names import HUB_SHAPES, REVISION

LOCKED_FROM = ("listing", "typed")
GIB = 1024**3
MAX_VOLUME_GIB = 16384  # gp3's largest volume (EBS User Guide): a larger file cannot sit on any planned root volume
MAX_MODEL_BYTES = MAX_VOLUME_GIB * GIB
_SHA256, _COMMIT = re.compile(r"[0-9a-f]{64}"), re.compile(r"[0-9a-f]{40}")
HEADER = """\
# Pinned model facts. Written by `gguf-serve-catalog lock <model>` (see README, "Adding a profile"); commit it.
# locked_from = "listing": size, sha256 and commit from ModelScope's file listing at `endpoint`, the [gguf]
# facts from the file's own header read with HTTP Range requests (header_bytes_read bytes, not the file).
# locked_from = "typed": not locked from a live listing yet; `source` says where each number comes from.
# Memory fit and the MTP check are computed from [gguf] (gguf_serve/catalog/model_facts.py); nothing else is typed.
# [tensors] (from the header's tensor info table, same reads): count, and expert_bytes per block for MoE files
# (the tensors --n-cpu-moe keeps in host RAM). Entries without it estimate expert bytes from [gguf].
# served_by: the host that served the header bytes (the hub's redirect target), beside the hub's `endpoint`.
# `cdk synth|deploy` writes an entry the same way when a stack's model has none from a listing
# (gguf_serve/catalog/lookup.py).
"""


@dataclass(frozen=True)
class LockedModel:
    name: str
    repo: str
    file: str
    revision: str  # what instances ask ModelScope for; the sha256 pins the bytes
    locked_from: str
    size_bytes: int
    sha256: str | None  # None: no pinned hash yet; a deployable profile with this model is refused at synth
    header: dict[str, Any] = field(default_factory=dict)  # gguf_serve.catalog.model_facts keys
    commit: str | None = None  # the listing's CommitId for the file when it was locked
    endpoint: str | None = None
    served_by: str | None = None  # host[:port] that served the header bytes (storage, after the hub's redirect)
    header_bytes_read: int | None = None
    locked_at: str | None = None  # UTC date of the lock
    source: str = ""
    tensors: dict[str, Any] = field(default_factory=dict)  # from the tensor info table: count, expert_bytes


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "repo": str,
    "file": str,
    "revision": str,
    "locked_from": str,
    "size_bytes": int,
    "sha256": str,
    "commit": str,
    "endpoint": str,
    "served_by": str,
    "header_bytes_read": int,
    "locked_at": str,
    "source": str,
    "gguf": dict,
    "tensors": dict,  # optional (entries locked before it have none): see TENSOR_KEYS
}
TENSOR_KEYS = {"count": int, "expert_bytes": list}
_REQUIRED = ("repo", "file", "revision", "locked_from", "size_bytes", "gguf")


def read_lock(path: Path) -> dict[str, LockedModel]:
    if not path.is_file():
        return {}
    return parse_lock(path.read_text(), path)


def parse_lock(text: str, path: Path) -> dict[str, LockedModel]:
    """Every entry of a lock file's text, each value checked for type and range (`path` names it in errors)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML ({e}); rerun `gguf-serve-catalog lock <model>`") from None
    return {name: _entry(name, table, path) for name, table in doc.items()}


def _entry(name: str, table: Any, path: Path) -> LockedModel:
    where = f"{path}: [{json.dumps(name)}]"
    if not isinstance(table, dict):
        raise ProfileError(f"{where} must be a table")
    for key, value in table.items():
        if key not in _FIELDS:
            raise ProfileError(f"{where}: unknown key {key!r}; known keys: {', '.join(_FIELDS)}")
        if not isinstance(value, _FIELDS[key]) or isinstance(value, bool):
            raise ProfileError(f"{where}: {key} must be {_FIELDS[key].__name__}, got {value!r}")  # type: ignore[union-attr]
    missing = [k for k in _REQUIRED if k not in table]
    if missing:
        raise ProfileError(f"{where}: missing {', '.join(missing)}; rerun `gguf-serve-catalog lock {name}`")
    if table["locked_from"] not in LOCKED_FROM:
        raise ProfileError(f"{where}.locked_from: {table['locked_from']!r} is not allowed; allowed: {LOCKED_FROM}")
    _check_values(table, f"{path}: {_key(name)}")
    header = table["gguf"]
    if not isinstance(header.get("architecture"), str) or not header["architecture"]:
        raise ProfileError(f"{where}.gguf: missing architecture (general.architecture)")
    tensors = table.get("tensors", {})
    for key, value in tensors.items():
        kind = TENSOR_KEYS.get(key)
        if kind is None or not isinstance(value, kind) or isinstance(value, bool):
            raise ProfileError(f"{where}.tensors: {key} = {value!r} is not one of {', '.join(TENSOR_KEYS)}")
    expert_bytes = tensors.get("expert_bytes", [])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in expert_bytes):
        raise ProfileError(f"{where}.tensors: expert_bytes must list non-negative integers, one per block")
    if tensors.get("count", 0) < 0:
        raise ProfileError(f"{where}.tensors.count: {tensors['count']} is negative; allowed: 0 or more tensors")
    values = {"sha256": None, **{k: v for k, v in table.items() if k not in ("gguf", "tensors")}}
    return LockedModel(name=name, header=header, tensors=tensors, **values)


def _check_values(table: dict[str, Any], where: str) -> None:
    """Ranges and shapes: `file: entry.key: what is wrong, what is allowed`."""

    def bad(key: str, what: str, allowed: str) -> ProfileError:
        return ProfileError(f"{where}.{key}: {what}; allowed: {allowed}")

    size = table["size_bytes"]
    if not 1 <= size <= MAX_MODEL_BYTES:
        raise bad("size_bytes", f"{size:,} bytes", f"1 to {MAX_MODEL_BYTES:,} bytes ({MAX_VOLUME_GIB:,} GiB, gp3's "
                  "largest volume: no planned root volume holds more)")  # fmt: skip
    if "sha256" in table and not _SHA256.fullmatch(table["sha256"]):
        raise bad("sha256", f"{table['sha256']!r} is not a sha256", "64 lowercase hex digits (or leave it out)")
    if "commit" in table and not _COMMIT.fullmatch(table["commit"]):
        raise bad("commit", f"{table['commit']!r} is not a commit id", "40 lowercase hex digits")
    for key in ("endpoint",):
        if key in table and not re.fullmatch(r"https?://[^\s/]+", table[key]):
            raise bad(key, f"{table[key]!r} is not a hub URL", "http(s)://host[:port]")
    if "served_by" in table and not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", table["served_by"]):
        raise bad("served_by", f"{table['served_by']!r} is not a host", "host[:port]")
    if table.get("header_bytes_read", 0) < 0:
        raise bad("header_bytes_read", f"{table['header_bytes_read']} is negative", "0 or more bytes")
    if "locked_at" in table:
        try:
            datetime.date.fromisoformat(table["locked_at"])
        except ValueError:
            raise bad("locked_at", f"{table['locked_at']!r} is not a date", "YYYY-MM-DD (UTC)") from None
    for key in ("repo", "file"):
        if not HUB_SHAPES[key][0](table[key]):
            raise bad(key, f"{table[key]!r} is not allowed", HUB_SHAPES[key][1])
    if not table["revision"] or not REVISION.fullmatch(table["revision"]):
        raise bad(
            "revision", f"{table['revision']!r}", "a branch, tag or commit of letters, digits, '.', '_', '-', '/'"
        )
    for key, value in table["gguf"].items():
        lowest = 1 if key in ("block_count", "context_length", "embedding_length") else 0
        values = value if isinstance(value, list) else [value]
        if key == "architecture":
            continue
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= lowest for v in values):
            raise bad(f"gguf.{_key(key)}", f"{value!r}", f"{'a positive' if lowest else 'a non-negative'} integer "
                      "(or one per layer), as the GGUF header gives it")  # fmt: skip
    check_ceilings(table["gguf"], f"{where}.gguf")  # after the types: each value is a whole number here


def render_lock(entries: dict[str, LockedModel]) -> str:
    out = [HEADER]
    for name in sorted(entries):
        e = entries[name]
        out.append(f"\n[{json.dumps(name)}]")
        for key in ("repo", "file", "revision", "locked_from", "size_bytes", "sha256", "commit", "endpoint",
                    "served_by", "header_bytes_read", "locked_at", "source"):  # fmt: skip
            value = getattr(e, key)
            if value is not None and value != "":
                out.append(f"{key} = {_value(value)}")
        out.append(f"\n[{json.dumps(name)}.gguf]")
        for key, value in e.header.items():
            out.append(f"{_key(key)} = {_value(value)}")
        if e.tensors:
            out.append(f"\n[{json.dumps(name)}.tensors]")
            for key, value in e.tensors.items():
                out.append(f"{_key(key)} = {_value(value)}")
    return "\n".join(out) + "\n"


def write_lock(path: Path, entries: dict[str, LockedModel]) -> None:
    """The whole file, validated as any later read will read it, then swapped in at once (never half-written)."""
    text = render_lock(entries)
    parse_lock(text, path)
    _replace(path, text)


def commit_entry(
    path: Path, entry: LockedModel, *, validate: Callable[[dict[str, LockedModel]], None] | None = None
) -> None:
    """Put one entry into the lock file: nothing is written unless the new file parses and `validate` (the
    catalog building the model from it) passes; a failure leaves the file byte-identical."""
    entries = read_lock(path)
    entries[entry.name] = entry
    text = render_lock(entries)
    parsed = parse_lock(text, path)
    if validate is not None:
        validate(parsed)
    _replace(path, text)


def _replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise TypeError(f"cannot write {value!r} to the lock file")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to the lock file")
