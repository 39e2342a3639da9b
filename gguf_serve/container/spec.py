"""The runtime spec: the only part of a profile an instance (or a container) is given.

A serving profile (gguf_serve.catalog, outside the image) joins hardware, prices, fleet sizing, descriptions,
the model and the server settings. An instance needs three of those: which file to fetch and check, the
llama-server flags, and the port. `ServingProfile.runtime()` cuts that out; the boot script writes it to
`names.RUNTIME_SPEC_PATH`, and the launcher and the fetcher read it with `RuntimeSpec.load`, the one loader.
Editing a price or a description changes no runtime spec, so it changes no user data, no release id and no image.

This package reads no catalog data and imports only the standard library: the image ships it whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gguf_serve.container.server import MAX_QUEUE_PER_SLOT, ServerSettings, Speculative

SCHEMA = "gguf-serve-runtime/1"
# ServerSettings fields added after schema 1 shipped, with the default an older spec means: left out of a spec
# when they hold it, so a profile that does not use them keeps its spec, user data and release id.
_ADDED_SERVER_FIELDS = {"n_cpu_moe": 0, "queue_per_slot": 4}
_ADDED_MODEL_FIELDS = {"commit": None}


class RuntimeSpecError(ValueError):
    """A runtime spec file that cannot be used on this instance; the message names the file and what is wrong."""


@dataclass(frozen=True)
class RuntimeModel:
    """The GGUF an instance fetches and checks before it starts the server."""

    name: str  # the served model name (--alias)
    repo: str  # ModelScope owner/name
    file: str  # path inside the repo
    revision: str
    size_bytes: int  # exact when sha256 is set; otherwise the planning estimate (free-space check only)
    sha256: str | None
    gguf_architecture: str  # general.architecture the file must declare
    has_mtp_layers: bool  # <arch>.nextn_predict_layers > 0
    commit: str | None = None  # the listing's commit at lock time: fetched instead of the revision (a branch)
    aliases: tuple[str, ...] = ()  # more names a request may give the model (the catalog's); the hop checks them

    @property
    def local_name(self) -> str:
        return self.file.rsplit("/", 1)[-1]

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name this model answers to, llama-server's own (--alias) first."""
        return tuple(dict.fromkeys((self.name, *self.aliases)))


@dataclass(frozen=True)
class RuntimeSpec:
    name: str  # the profile it came from, for log lines
    model: RuntimeModel
    server: ServerSettings
    threads: int  # resolved for the instance type (one per physical core unless the profile says otherwise)

    @property
    def mtp(self) -> bool:
        return self.server.speculative is not None

    @property
    def on_gpu(self) -> bool:
        return self.server.gpu_layers > 0

    def to_json(self) -> str:
        doc = asdict(self)
        for key, default in _ADDED_SERVER_FIELDS.items():  # written only when set: older specs stay byte-identical
            if doc["server"][key] == default:
                del doc["server"][key]
        for key, default in _ADDED_MODEL_FIELDS.items():
            if doc["model"][key] == default:
                del doc["model"][key]
        return json.dumps({"schema": SCHEMA, **doc}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, source: str = "runtime spec") -> RuntimeSpec:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise RuntimeSpecError(f"{source} is not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise RuntimeSpecError(
                f"{source} is not a {SCHEMA} runtime spec (schema {found!r}): write it with "
                "catalog's ServingProfile.runtime().to_json() (the boot script does)"
            )
        model = _typed(RuntimeModel, _section(doc, "model", source), f"{source}: model")
        server_doc = dict(_section(doc, "server", source))
        spec_doc = server_doc.get("speculative")
        if spec_doc is not None:
            if not isinstance(spec_doc, dict):
                raise RuntimeSpecError(f"{source}: server.speculative must be an object or null")
            server_doc["speculative"] = _typed(Speculative, spec_doc, f"{source}: server.speculative")
        server = _typed(ServerSettings, server_doc, f"{source}: server")
        spec = _typed(cls, {**doc, "model": model, "server": server}, source, skip=("schema",))
        spec._check(source)
        return spec

    @classmethod
    def load(cls, path: str | Path) -> RuntimeSpec:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise RuntimeSpecError(f"cannot read the runtime spec {path}: {e.strerror}") from None
        return cls.from_json(text, source=str(path))

    def _check(self, source: str) -> None:
        s = self.server
        if self.threads < 1 or s.parallel < 1 or s.ctx_per_slot < 512 or not 0 < s.port < 65536:
            raise RuntimeSpecError(f"{source}: threads, parallel, ctx_per_slot or port is out of range")
        if not 0 <= s.queue_per_slot <= MAX_QUEUE_PER_SLOT:
            raise RuntimeSpecError(f"{source}: server.queue_per_slot must be 0-{MAX_QUEUE_PER_SLOT}")
        if self.mtp and not self.model.has_mtp_layers:
            raise RuntimeSpecError(f"{source}: MTP is on but {self.model.file} has no MTP layers")
        if self.model.sha256 is not None and len(self.model.sha256) != 64:
            raise RuntimeSpecError(f"{source}: model.sha256 must be 64 hex digits")
        if self.model.commit is not None and not _is_commit(self.model.commit):
            raise RuntimeSpecError(f"{source}: model.commit must be 40 hex digits (the listing's commit)")


def _is_commit(text: str) -> bool:
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)


def _section(doc: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise RuntimeSpecError(f"{source}: {key!r} must be an object")
    return value


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "str | None": (str, type(None)),
    "int | None": (int, type(None)),
    "tuple[str, ...]": (list, tuple),
}


def _typed(cls: type, doc: dict[str, Any], where: str, skip: tuple[str, ...] = ()) -> Any:
    """cls(**doc) with every field present and of its declared type: a wrong file fails here, in one line."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(doc) - set(known) - set(skip))
    if unknown:
        raise RuntimeSpecError(f"{where}: unknown field(s) {', '.join(unknown)}")
    values = {}
    for name, f in known.items():
        if name not in doc:
            if f.default is f.default_factory:  # both MISSING: a required field
                raise RuntimeSpecError(f"{where}: missing field {name!r}")
            continue
        value, allowed = doc[name], _TYPES.get(str(f.type))
        wrong_bool = isinstance(value, bool) and bool not in (allowed or ())  # True is an int to isinstance
        if allowed is not None and (not isinstance(value, allowed) or wrong_bool):
            raise RuntimeSpecError(f"{where}: {name} must be {f.type}, got {type(value).__name__}")
        if isinstance(value, list | tuple):
            if not all(isinstance(v, str) and v.strip() for v in value):
                raise RuntimeSpecError(f"{where}: {name} must be a list of non-empty strings")
            value = tuple(value)
        values[name] = value
    return cls(**values)
