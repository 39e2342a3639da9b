"""The stdlib GGUF reader agrees with the gguf package and tells MTP files from the rest."""

from __future__ import annotations

from pathlib import Path

import gguf as gguf_pkg
import pytest

from gguf_serve.container.fetch.gguf import GGUFError, SkippedArray, has_mtp_layers, read_metadata, summarize
from tests.container.fetch.conftest import write_tiny_gguf


def _reference(path: Path) -> dict[str, object]:
    """Every field as the gguf package decodes it (arrays as lists)."""
    out: dict[str, object] = {}
    for name, field in gguf_pkg.GGUFReader(str(path)).fields.items():
        value = field.contents()
        out[name] = value
    return out


def _same(ours: object, theirs: object) -> bool:
    if isinstance(ours, float) or isinstance(theirs, float):
        return abs(float(ours) - float(theirs)) <= 1e-6 * max(1.0, abs(float(theirs)))  # type: ignore[arg-type]
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(_same(a, b) for a, b in zip(ours, theirs, strict=True))
    return ours == theirs


def test_gemma_metadata_matches_the_gguf_package(gemma_gguf: Path) -> None:
    ours = read_metadata(gemma_gguf, max_array=10**6)
    theirs = _reference(gemma_gguf)
    assert set(ours) == set(theirs)
    mismatched = [k for k in theirs if not _same(ours[k], theirs[k])]
    assert mismatched == []
    assert ours["general.architecture"] == "gemma3"
    assert len(ours["tokenizer.ggml.tokens"]) == 262144


def test_long_arrays_are_skipped_not_decoded(gemma_gguf: Path) -> None:
    meta = read_metadata(gemma_gguf)
    assert meta["tokenizer.ggml.tokens"] == SkippedArray(item_type=8, length=262144)
    assert meta["general.tags"] == ["gemma3", "gemma", "google", "text-generation"]
    assert meta["gemma3.block_count"] == 18  # keys after the skipped arrays are still read correctly
    assert meta["general.file_type"] == 15


def test_gemma_has_no_mtp_layers(gemma_gguf: Path) -> None:
    assert has_mtp_layers(gemma_gguf) is False
    s = summarize(gemma_gguf)
    assert (s.architecture, s.nextn_predict_layers, s.tensor_count) == ("gemma3", 0, 236)


@pytest.mark.parametrize(
    ("arch", "nextn", "expected"),
    [("qwen35", 1, True), ("qwen35moe", 3, True), ("qwen35", 0, False), ("qwen35", None, False)],
)
def test_mtp_detection_on_generated_gguf(tmp_path: Path, arch: str, nextn: int | None, expected: bool) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", arch, nextn)
    assert has_mtp_layers(path) is expected
    meta = read_metadata(path)
    assert meta["general.architecture"] == arch
    assert (f"{arch}.nextn_predict_layers" in meta) is (nextn is not None)
    theirs = _reference(path)
    assert all(_same(read_metadata(path, max_array=10**6)[k], v) for k, v in theirs.items())


def test_not_a_gguf(tmp_path: Path) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(b"<html>404</html>")
    with pytest.raises(GGUFError, match="not a GGUF"):
        read_metadata(p)


def test_truncated_header(tmp_path: Path) -> None:
    full = write_tiny_gguf(tmp_path / "full.gguf", "qwen35", 1).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full[:60])
    with pytest.raises(GGUFError, match="truncated"):
        read_metadata(cut)
