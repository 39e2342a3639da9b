"""`report` fed the field report's own figures reproduces its tables, number for number."""

from __future__ import annotations

import pytest

from gguf_serve.local.bench import results, tables
from gguf_serve.local.bench.cli import main
from tests.committed import CATALOG, HARDWARE

REPORT = results.load(catalog=CATALOG)


def cells(markdown: str) -> list[list[str]]:
    """Data rows of the first Markdown table, as stripped cells."""
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows[2:]]


def test_the_shipped_file_holds_all_ten_rows_of_table_5_1() -> None:
    assert len(REPORT.measurements) == 10
    assert {m.instance_type for m in REPORT.measurements} == {"c8g.4xlarge", "c8i.4xlarge", "g5.xlarge"}


def test_table_5_1_full_data() -> None:
    assert cells(tables.full_data(REPORT)) == [
        ["c8g.4xlarge", "Graviton4 ARM", "Qwen3.6-27B (Dense)", "OFF", "245.1", "8.50", "—"],
        ["c8g.4xlarge", "Graviton4 ARM", "Qwen3.6-27B (Dense)", "ON", "342.4", "6.08", "84.8%"],
        ["c8g.4xlarge", "Graviton4 ARM", "Qwen3.6-35B-A3B (MoE)", "OFF", "52.9", "39.34", "—"],
        ["c8g.4xlarge", "Graviton4 ARM", "Qwen3.6-35B-A3B (MoE)", "ON", "87.8", "23.72", "81.2%"],
        ["c8i.4xlarge", "Intel x86", "Qwen3.6-27B (Dense)", "OFF", "456.9", "4.56", "—"],
        ["c8i.4xlarge", "Intel x86", "Qwen3.6-27B (Dense)", "ON", "281.1", "5.36", "80.3%"],
        ["c8i.4xlarge", "Intel x86", "Qwen3.6-35B-A3B (MoE)", "OFF", "123.9", "16.81", "—"],
        ["c8i.4xlarge", "Intel x86", "Qwen3.6-35B-A3B (MoE)", "ON", "151.5", "13.75", "82.8%"],
        ["g5.xlarge", "A10G GPU", "Qwen3.6-27B (Dense)", "OFF", "79.6", "26.17", "—"],
        ["g5.xlarge", "A10G GPU", "Qwen3.6-27B (Dense)", "ON", "43.5", "47.89", "78.8%"],
    ]


def test_table_5_2_mtp_effect_in_the_reports_order() -> None:
    text = tables.mtp_effect(REPORT)
    assert cells(text) == [
        ["g5.xlarge", "A10G GPU", "27B Dense", "26.17", "47.89", "+83.0%", "78.8%"],
        ["c8i.4xlarge", "Intel x86", "27B Dense", "4.56", "5.36", "+17.6% ¹", "80.3%"],
        ["c8i.4xlarge", "Intel x86", "35B-A3B MoE", "16.81", "13.75", "-18.2%", "82.8%"],
        ["c8g.4xlarge", "Graviton4 ARM", "27B Dense", "8.50", "6.08", "-28.4% ¹", "84.8%"],
        ["c8g.4xlarge", "Graviton4 ARM", "35B-A3B MoE", "39.34", "23.72", "-39.7%", "81.2%"],
    ]


def test_two_published_changes_differ_from_the_rounded_inputs_and_say_so() -> None:
    """The report computed +17.6% and -28.4% from unrounded tok/s; 5.36/4.56 and 6.08/8.50 give +17.5%, -28.5%."""
    effects = {(e.on.instance_type, e.on.model): e for e in tables.mtp_effects(REPORT)}
    c8i = effects["c8i.4xlarge", "Qwen3.6-27B"]
    c8g = effects["c8g.4xlarge", "Qwen3.6-27B"]
    assert (round(c8i.change_pct, 1), c8i.shown_pct) == (17.5, 17.6)
    assert (round(c8g.change_pct, 1), c8g.shown_pct) == (-28.5, -28.4)
    note = tables.mtp_effect(REPORT).split("¹ ", 2)[-1]
    assert "+17.6% as published; the rounded tok/s above give +17.5%" in note
    assert "-28.4% as published; the rounded tok/s above give -28.5%" in note


def test_a_published_change_the_rounding_cannot_explain_is_not_shown() -> None:
    tampered = results.load(catalog=CATALOG)
    tampered.published_mtp_change_pct["g5.xlarge", "Qwen3.6-27B"] = 90.0
    row = next(r for r in cells(tables.mtp_effect(tampered)) if r[0] == "g5.xlarge")
    assert row[5] == "+83.0%"


def test_table_5_3_platform_comparison() -> None:
    text = tables.platform_comparison(REPORT)
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header[2:] == [
        "c8g.4xlarge (Graviton4 ARM)",
        "c8i.4xlarge (Intel x86)",
        "g5.xlarge (A10G GPU)",
        "Graviton4/Intel",
    ]
    assert cells(text) == [
        ["27B Dense", "OFF", "8.50", "4.56", "26.17", "1.86x"],
        ["27B Dense", "ON", "6.08", "5.36", "47.89", "1.13x"],
        ["35B-A3B MoE", "OFF", "39.34", "16.81", "—", "2.34x"],
        ["35B-A3B MoE", "ON", "23.72", "13.75", "—", "1.73x"],
    ]


def test_table_5_4_moe_vs_dense() -> None:
    assert cells(tables.moe_vs_dense(REPORT)) == [
        ["c8g.4xlarge (Graviton4 ARM)", "8.50", "39.34", "4.63x"],
        ["c8i.4xlarge (Intel x86)", "4.56", "16.81", "3.69x"],
    ]


def test_section_8_cost_table_to_the_cent() -> None:
    assert cells(tables.cost_table(REPORT)) == [
        ["c8g.4xlarge", "35B-A3B MoE, MTP OFF", "39.34", "9,069", "755.75", "¥7.41", "—"],
        ["c8i.4xlarge", "35B-A3B MoE, MTP OFF", "16.81", "13,237", "1,103.08", "¥25.32", "—"],
        ["g5.xlarge", "27B Dense, MTP ON", "47.89", "34,228", "2,852.33", "¥22.98", "~¥55.16"],
    ]


def test_findings_6_4_and_summary_ratios_follow_from_the_figures() -> None:
    """CPU reaches 82% of the GPU's speed at 26% of its cost (sections 6.4 and 9)."""
    cpu = REPORT.find(instance_type="c8g.4xlarge", model="Qwen3.6-35B-A3B", mtp=False)
    gpu = REPORT.find(instance_type="g5.xlarge", model="Qwen3.6-27B", mtp=True)
    assert cpu and gpu
    assert round(cpu.effective_tok_s / gpu.effective_tok_s * 100) == 82
    from tests.committed import HARDWARE

    ratio = HARDWARE["c8g.4xlarge"].ri_1yr_all_upfront_cny / HARDWARE["g5.xlarge"].ri_1yr_all_upfront_cny
    assert round(ratio * 100) == 26


def test_report_cli_prints_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    for heading in ("5.1 Full data", "5.2 MTP effect", "5.3 Platform comparison", "5.4 MoE vs dense", "8 Cost"):
        assert f"## {heading}" in out
    for number in (
        "+83.0%",
        "+17.6%",
        "-18.2%",
        "-28.4%",
        "-39.7%",
        "1.86x",
        "1.13x",
        "2.34x",
        "1.73x",
        "4.63x",
        "3.69x",
        "¥7.41",
        "¥25.32",
        "¥22.98",
        "755.75",
        "1,103.08",
        "2,852.33",
    ):
        assert number in out, number


def test_report_cli_writes_the_reports_charts(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "report.md"
    assert main(["report", "--charts", str(tmp_path / "img"), "-o", str(md)]) == 0
    written = sorted(p.name for p in (tmp_path / "img").iterdir())
    assert written == ["cost.png", "mtp-effect.png", "platform.png", "throughput.png"]
    for name in written:
        data = (tmp_path / "img" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 200_000
    assert "4.63x" in md.read_text(encoding="utf-8")


def test_every_row_but_one_generated_about_2083_tokens() -> None:
    """total time x tok/s: each run hit the 2048-token cap; c8i 27B MTP on (281.1 s) is the report's outlier."""
    tokens = {(m.instance_type, m.model, m.mtp): m.total_time_s * m.effective_tok_s for m in REPORT.measurements}
    outlier = tokens.pop(("c8i.4xlarge", "Qwen3.6-27B", True))
    assert all(2080 < t < 2085 for t in tokens.values()), tokens
    assert 1500 < outlier < 1510


def test_the_catalog_descriptions_quote_what_bench_computes() -> None:
    """The profile descriptions repeat tok/s and yuan per million; they must agree with the figures and prices."""
    from gguf_serve.local.bench import cost
    from tests.committed import PROFILES

    for p in PROFILES.values():
        m = REPORT.find(instance_type=p.hardware.instance_type, model=p.model.name, mtp=p.mtp)
        if m is None:  # not measured in the report (the headroom profile): it must say its figure is an estimate
            assert "estimate" in p.description and "tok/s, ¥" not in p.description, (p.name, p.description)
            continue
        per_m = cost.ri_cost(p.hardware.instance_type, m.effective_tok_s, hardware=HARDWARE).cny_per_million
        assert f"({m.effective_tok_s:.2f} tok/s, ¥{per_m:.2f}/M)" in p.description, p.description
