"""Results documents: what `run` writes and what `report`, `cost` and `recommend` read.

A results file is either one run document (`schema` SCHEMA, `kind` "sequential" or "concurrency") or a collection
(`schema` COLLECTION_SCHEMA) holding several documents, like the field report's own figures in data/.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_serve.catalog import Catalog, Hardware

SCHEMA = "gguf-serve-bench/1"
COLLECTION_SCHEMA = "gguf-serve-bench-collection/1"
# The same documents under the model-specific names of earlier releases: still read, never written.
_EARLIER = {"qwen36-bench/1": SCHEMA, "qwen36-bench-collection/1": COLLECTION_SCHEMA}
FIELD_REPORT = Path(__file__).parent / "data" / "field-report.json"


@dataclass(frozen=True)
class Measurement:
    """One configuration measured one request at a time: a row of table 5.1."""

    instance_type: str
    hardware: str  # short label, e.g. "Graviton4 ARM"
    model: str
    moe: bool
    mtp: bool
    total_time_s: float  # wall time of one request
    effective_tok_s: float  # completion tokens / wall time
    draft_acceptance: float | None  # draft_n_accepted / draft_n, 0..1; None without speculative decoding
    profile: str | None = None


@dataclass(frozen=True)
class Estimate:
    """A throughput the source states without having measured it."""

    instance_type: str
    model: str
    mtp: bool
    tok_s_low: float
    tok_s_high: float
    note: str


@dataclass
class Results:
    catalog: Catalog  # where instance types, prices, models and profiles come from (catalog.load_catalog)
    measurements: list[Measurement] = field(default_factory=list)
    concurrency: list[dict[str, Any]] = field(default_factory=list)  # concurrency documents as written
    sequential: list[dict[str, Any]] = field(default_factory=list)  # measured run documents as written (not published)
    published_mtp_change_pct: dict[tuple[str, str], float] = field(default_factory=dict)
    estimates: list[Estimate] = field(default_factory=list)

    def find(self, *, instance_type: str, model: str, mtp: bool) -> Measurement | None:
        for m in self.measurements:
            if (m.instance_type, m.model, m.mtp) == (instance_type, model, mtp):
                return m
        return None

    def estimate(self, *, instance_type: str, model: str, mtp: bool) -> Estimate | None:
        for e in self.estimates:
            if (e.instance_type, e.model, e.mtp) == (instance_type, model, mtp):
                return e
        return None


def hardware_label(hw: Hardware) -> str:
    if hw.gpu:
        return f"{hw.gpu.removeprefix('NVIDIA ')} GPU"
    return hw.cpu


def is_moe(model: str, catalog: Catalog, fallback: bool = False) -> bool:
    artifact = catalog.models.get(model)
    return artifact.is_moe if artifact else fallback


def load(paths: Iterable[str | Path] = (), *, catalog: Catalog) -> Results:
    """Read results files (the field report's figures when none are given), labelled from `catalog`."""
    paths = list(paths) or [FIELD_REPORT]
    out = Results(catalog)
    for path in paths:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        try:
            _add(out, doc, str(path))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not a valid benchmark results file ({type(e).__name__}: {e})") from None
    return out


def schema_of(doc: dict[str, Any]) -> Any:
    """A document's schema id, an earlier release's name mapped to today's."""
    schema = doc.get("schema")
    return _EARLIER.get(schema, schema) if isinstance(schema, str) else schema


def _add(out: Results, doc: dict[str, Any], where: str) -> None:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: not a benchmark results file (a JSON {type(doc).__name__}, not an object)")
    schema = schema_of(doc)
    if schema == COLLECTION_SCHEMA:
        for item in doc.get("results", []):
            _add_run(out, item, where)
        for p in doc.get("published_mtp_change_pct", []):
            out.published_mtp_change_pct[(p["instance_type"], p["model"])] = float(p["value"])
        out.estimates += [Estimate(**e) for e in doc.get("estimates", [])]
    elif schema == SCHEMA:
        _add_run(out, doc, where)
    else:
        raise ValueError(f"{where}: not a benchmark results file (schema {schema!r}; expected {SCHEMA!r})")


def _add_run(out: Results, doc: dict[str, Any], where: str) -> None:
    if doc.get("complete") is False or doc.get("summary") is None:
        valid = sum(1 for r in doc.get("runs", []) if not r.get("warmup") and "error" not in r)
        raise ValueError(
            f"{where}: an unfinished run ({valid} valid measured requests); finish it with the same "
            f"`gguf-serve-bench run ... -o {where}`"
        )
    if doc.get("kind") == "concurrency":
        out.concurrency.append(doc)
        return
    if doc.get("kind") == "sequential":
        out.sequential.append(doc)
    s = doc["summary"]
    out.measurements.append(
        Measurement(
            instance_type=doc["instance_type"],
            hardware=doc["hardware"],
            model=doc["model"],
            moe=is_moe(doc["model"], out.catalog, doc.get("moe", False)),
            mtp=bool(doc["mtp"]),
            total_time_s=float(s["total_time_s"]),
            effective_tok_s=float(s["effective_tok_s"]),
            draft_acceptance=s.get("draft_acceptance"),
            profile=doc.get("profile"),
        )
    )


def write(doc: dict[str, Any], path: str | Path) -> Path:
    """Replace `path` atomically: a run killed mid-write keeps the previous, complete version."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
