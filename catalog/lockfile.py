"""The model lock file: pinned facts per model (revision, size, sha256, GGUF header), read and written as TOML.

`python -m catalog lock <model>` writes an entry from ModelScope's listing and the file's own header
(`locked_from = "listing"`). An entry nobody could lock yet says `locked_from = "typed"` and where each number
comes from in `source`. The catalog computes memory fit and the MTP check from these facts.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from catalog.errors import ProfileError

LOCKED_FROM = ("listing", "typed")
HEADER = """\
# Pinned model facts. Written by `python -m catalog lock <model>` (see README, "Adding a profile"); commit it.
# locked_from = "listing": size, sha256 and commit from ModelScope's file listing at `endpoint`, the [gguf]
# facts from the file's own header read with HTTP Range requests (header_bytes_read bytes, not the file).
# locked_from = "typed": not locked from a live listing yet; `source` says where each number comes from.
# Memory fit and the MTP check are computed from [gguf] (catalog/model_facts.py); nothing else is typed.
# [tensors] (from the header's tensor info table, same reads): count, and expert_bytes per block for MoE files
# (the tensors --n-cpu-moe keeps in host RAM). Entries without it estimate expert bytes from [gguf].
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
    header: dict[str, Any] = field(default_factory=dict)  # catalog.model_facts keys
    commit: str | None = None  # the listing's CommitId for the file when it was locked
    endpoint: str | None = None
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
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML ({e}); rerun `python -m catalog lock <model>`") from None
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
        raise ProfileError(f"{where}: missing {', '.join(missing)}; rerun `python -m catalog lock {name}`")
    if table["locked_from"] not in LOCKED_FROM:
        raise ProfileError(f"{where}: locked_from must be one of {LOCKED_FROM}")
    header = table["gguf"]
    if not isinstance(header.get("architecture"), str):
        raise ProfileError(f"{where}.gguf: missing architecture (general.architecture)")
    tensors = table.get("tensors", {})
    for key, value in tensors.items():
        kind = TENSOR_KEYS.get(key)
        if kind is None or not isinstance(value, kind) or isinstance(value, bool):
            raise ProfileError(f"{where}.tensors: {key} = {value!r} is not one of {', '.join(TENSOR_KEYS)}")
    expert_bytes = tensors.get("expert_bytes", [])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in expert_bytes):
        raise ProfileError(f"{where}.tensors: expert_bytes must list non-negative integers, one per block")
    values = {"sha256": None, **{k: v for k, v in table.items() if k not in ("gguf", "tensors")}}
    return LockedModel(name=name, header=header, tensors=tensors, **values)


def write_lock(path: Path, entries: dict[str, LockedModel]) -> None:
    out = [HEADER]
    for name in sorted(entries):
        e = entries[name]
        out.append(f"\n[{json.dumps(name)}]")
        for key in ("repo", "file", "revision", "locked_from", "size_bytes", "sha256", "commit", "endpoint",
                    "header_bytes_read", "locked_at", "source"):  # fmt: skip
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
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(out) + "\n")
    tmp.replace(path)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to the lock file")
