"""A small parser for the Prometheus text exposition format (version 0.0.4), enough for llama-server's /metrics."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
# histogram and summary samples belong to the family named without these suffixes
_SUFFIXES = ("_bucket", "_sum", "_count", "_created")
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass
class MetricFamily:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)

    def value(self, **labels: str) -> float | None:
        """The value of the sample whose labels are exactly `labels` (none: the unlabelled sample), else None."""
        for s in self.samples:
            if s.labels == labels:
                return s.value
        return None


def parse_prometheus(text: str) -> dict[str, MetricFamily]:
    """Parse exposition text into families keyed by metric name. Raises ValueError naming the bad line."""
    families: dict[str, MetricFamily] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            if line.startswith("#"):
                _parse_comment(line, families)
            else:
                sample = _parse_sample(line)
                _family_for(sample.name, families).samples.append(sample)
        except ValueError as e:
            raise ValueError(f"line {lineno}: {e}: {raw!r}") from None
    return families


def _family_for(sample_name: str, families: dict[str, MetricFamily]) -> MetricFamily:
    if sample_name in families:
        return families[sample_name]
    for suffix in _SUFFIXES:
        base = sample_name.removesuffix(suffix)
        if base != sample_name and families.get(base) and families[base].type in ("histogram", "summary"):
            return families[base]
    return families.setdefault(sample_name, MetricFamily(sample_name))


def _parse_comment(line: str, families: dict[str, MetricFamily]) -> None:
    parts = line[1:].strip().split(None, 2)
    if len(parts) < 2 or parts[0] not in ("HELP", "TYPE"):
        return  # a plain comment
    keyword, name = parts[0], parts[1]
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad metric name {name!r}")
    rest = parts[2] if len(parts) > 2 else ""
    family = families.setdefault(name, MetricFamily(name))
    if keyword == "HELP":
        family.help = _unescape_help(rest)
    else:
        kind = rest.strip()
        if kind not in _TYPES:
            raise ValueError(f"unknown metric type {kind!r}")
        family.type = kind


def _parse_sample(line: str) -> Sample:
    m = _NAME.match(line)
    if not m:
        raise ValueError("no metric name")
    name, pos = m.group(), m.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        labels, pos = _parse_labels(line, pos + 1)
    fields = line[pos:].split()
    if not fields or len(fields) > 2 or (pos < len(line) and not line[pos].isspace()):
        raise ValueError("expected a value and an optional timestamp after the name")
    value = _parse_value(fields[0])
    timestamp = None
    if len(fields) == 2:
        try:
            timestamp = int(fields[1])
        except ValueError:
            raise ValueError(f"bad timestamp {fields[1]!r}") from None
    return Sample(name, labels, value, timestamp)


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if not m:
            raise ValueError("bad label name")
        key, pos = m.group(), m.end()
        if not line.startswith('="', pos):
            raise ValueError(f'label {key!r} needs ="value"')
        pos += 2
        chars: list[str] = []
        while True:
            if pos >= len(line):
                raise ValueError(f"unterminated value of label {key!r}")
            c = line[pos]
            if c == "\\" and pos + 1 < len(line):
                chars.append(_ESCAPES.get(line[pos + 1], "\\" + line[pos + 1]))
                pos += 2
            elif c == '"':
                pos += 1
                break
            else:
                chars.append(c)
                pos += 1
        if key in labels:
            raise ValueError(f"duplicate label {key!r}")
        labels[key] = "".join(chars)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            raise ValueError("expected , or } after a label")


def _parse_value(text: str) -> float:
    # float() reads NaN, +Inf and -Inf; it also takes "1_0", which the format does not
    try:
        if "_" in text:
            raise ValueError
        return float(text)
    except ValueError:
        raise ValueError(f"bad value {text!r}") from None


def _unescape_help(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "\\n":
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
