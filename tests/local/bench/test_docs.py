"""docs/benchmark.md shows what the commands print: regenerate it when they change."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_serve.local.bench import recommend, results, tables
from gguf_serve.local.bench.cli import main
from tests.committed import CATALOG

DOC = (Path(__file__).resolve().parents[3] / "docs" / "benchmark.md").read_text(encoding="utf-8")
REPORT = results.load(catalog=CATALOG)


@pytest.mark.parametrize(
    "table",
    [tables.full_data, tables.mtp_effect, tables.platform_comparison, tables.moe_vs_dense],
    ids=["5.1", "5.2", "5.3", "5.4"],
)
def test_the_docs_show_the_report_tables_as_printed(table) -> None:
    assert table(REPORT) in DOC


def test_the_docs_show_the_cost_table_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost"]) == 0
    assert capsys.readouterr().out.split("\n\n")[0].strip() in DOC


def test_the_docs_show_every_deploy_line_and_the_cost_first_answer() -> None:
    r = recommend.recommend(gpu_quota=False, priority="cost", figures=REPORT)
    assert recommend.render(r) in DOC
    for stack in ("GpuMtpStack", "GravitonMoeStack"):
        assert f"`npx cdk deploy {stack}`" in DOC


def test_the_docs_images_exist_and_are_small() -> None:
    img = Path(__file__).resolve().parents[3] / "docs" / "img"
    for line in DOC.splitlines():
        if line.startswith("![") and "](img/" in line:
            path = img / line.split("](img/")[1].rstrip(")")
            assert path.is_file() and path.stat().st_size < 150_000, path


def test_the_docs_show_the_local_run_as_report_prints_it() -> None:
    local = results.load(
        sorted(
            (Path(__file__).resolve().parents[3] / "gguf_serve" / "local" / "bench" / "data" / "local-run").glob(
                "*.json"
            )
        ),
        catalog=CATALOG,
    )
    assert len(local.sequential) == 1 and len(local.concurrency) == 1
    for table in (tables.full_data, tables.per_run, tables.concurrency_table):
        assert table(local) in DOC
    s = local.sequential[0]["summary"]
    assert s["harness_generation_tok_s"] / s["predicted_per_second"] == pytest.approx(1, abs=0.0002)
    assert local.sequential[0]["method"]["max_tokens"] == 2048  # the report's full method


def test_the_docs_show_the_roofline_of_the_reports_figures_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    from gguf_serve.local.bench import roofline

    assert roofline.figures_table(REPORT, CATALOG) in DOC
    assert main(["roofline", "--all"]) == 0
    every = capsys.readouterr().out
    assert "| g5.xlarge | Qwen3.6-27B, MTP OFF | 26.17 |" in every
    for row in every.splitlines():
        if row.startswith(("| g5.xlarge | Qwen3.6-27B, MTP OFF", "| c8g.4xlarge | Qwen3.6-27B, MTP OFF")):
            assert row in DOC  # the dense rows the text sets beside the MoE's


def test_the_docs_show_the_capacity_curves_as_capacity_prints_them() -> None:
    import json

    from gguf_serve.local.bench import capacity

    data = Path(__file__).resolve().parents[3] / "gguf_serve" / "local" / "bench" / "data" / "capacity"
    paths = sorted(data.glob("*.json"))
    assert len(paths) == 2
    for path in paths:
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert doc["complete"] is True and doc["method"]["max_tokens"] == 2048  # the report's full method
        assert doc["server_slots"] == doc["method"]["streams"][-1] == 8  # no step queued behind the slots
        assert capacity.table(doc) in DOC
        m = doc["method"]
        knee = capacity.find_knee(doc["steps"], min_growth=m["knee_growth"], ttft_limit_s=m["ttft_p95_limit_s"])
        assert f"knee: {capacity.streams_text(knee.streams)}: {knee.reason}" in DOC
