"""Result files carry model-neutral schema ids; files written under the earlier qwen36 ids still load."""

from __future__ import annotations

import json

from gguf_serve.container.fetch.modelscope import USER_AGENT
from gguf_serve.local.bench import results
from tests.committed import CATALOG


def test_the_committed_figures_use_the_new_ids():
    doc = json.loads(results.FIELD_REPORT.read_text())
    assert doc["schema"] == results.COLLECTION_SCHEMA == "gguf-serve-bench-collection/1"
    assert results.SCHEMA == "gguf-serve-bench/1"


def test_a_file_of_an_earlier_release_still_loads(tmp_path):
    doc = json.loads(results.FIELD_REPORT.read_text())
    doc["schema"] = "qwen36-bench-collection/1"
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert results.load([old], catalog=CATALOG).measurements == results.load(catalog=CATALOG).measurements
    assert results.schema_of({"schema": "qwen36-bench/1"}) == results.SCHEMA


def test_the_fetcher_names_the_tool_not_a_model():
    assert USER_AGENT == "gguf-serve-fetch/1 (gguf-serve)" and "qwen" not in USER_AGENT.lower()
