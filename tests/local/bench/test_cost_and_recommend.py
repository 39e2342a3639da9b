"""The cost model's month convention and the decision tree's branches."""

from __future__ import annotations

import json

import pytest

from gguf_serve.local.bench import cost, recommend, results
from gguf_serve.local.bench.cli import main
from tests.committed import CATALOG, HARDWARE, PROFILES

REPORT = results.load(catalog=CATALOG)


@pytest.mark.parametrize(
    ("instance", "tok_s", "monthly", "per_million"),
    [
        ("c8g.4xlarge", 39.34, "755.75", "7.41"),
        ("c8i.4xlarge", 16.81, "1,103.08", "25.32"),
        ("g5.xlarge", 47.89, "2,852.33", "22.98"),
    ],
)
def test_ri_cost_reproduces_the_report_to_the_cent(instance: str, tok_s: float, monthly: str, per_million: str):
    c = cost.ri_cost(instance, tok_s, hardware=HARDWARE)
    assert cost.money(c.monthly_cny) == monthly
    assert f"{c.cny_per_million:.2f}" == per_million
    assert c.yearly_cny == HARDWARE[instance].ri_1yr_all_upfront_cny
    assert not c.estimate


def test_the_month_convention_is_yearly_over_12_with_a_30_day_token_month():
    """A 365-day token year would give 7.31, not the report's 7.41: the report mixes the two months."""
    c = cost.ri_cost("c8g.4xlarge", 39.34, hardware=HARDWARE)
    assert c.monthly_cny == pytest.approx(9069 / 12)
    assert c.cny_per_million == pytest.approx(9069 / 12 / (39.34 * 30 * 86400 / 1e6))
    assert round(9069 / (39.34 * 365 * 86400 / 1e6), 2) == 7.31
    assert "/ 12" in cost.CONVENTION and "30 days" in cost.CONVENTION


def test_utilization_scales_the_cost_per_token():
    full = cost.ri_cost("c8g.4xlarge", 39.34, 1.0, hardware=HARDWARE)
    half = cost.ri_cost("c8g.4xlarge", 39.34, 0.5, hardware=HARDWARE)
    assert half.monthly_cny == full.monthly_cny
    assert half.cny_per_million == pytest.approx(2 * full.cny_per_million)
    with pytest.raises(ValueError, match="utilization"):
        cost.ri_cost("c8g.4xlarge", 39.34, 0, hardware=HARDWARE)


def test_on_demand_is_priced_only_where_known_and_always_marked_an_estimate():
    assert cost.on_demand_cost("c8g.4xlarge", 39.34, hardware=HARDWARE) is None
    od = cost.on_demand_cost("g5.xlarge", 47.89, hardware=HARDWARE)
    assert od is not None and od.estimate
    assert od.monthly_cny == pytest.approx(HARDWARE["g5.xlarge"].on_demand_cny_per_hour * 720)


def test_unknown_instance_names_the_known_ones():
    with pytest.raises(ValueError, match="c8g.4xlarge"):
        cost.ri_cost("c9z.huge", 10, hardware=HARDWARE)


def test_cost_cli_table_and_json(capsys: pytest.CaptureFixture[str]):
    assert main(["cost"]) == 0
    out = capsys.readouterr().out
    for text in ("755.75", "1,103.08", "2,852.33", "¥7.41", "¥25.32", "¥22.98", "30 days", "/ 12"):
        assert text in out
    assert main(["cost", "--instance", "c8g.4xlarge", "--tok-s", "39.34", "--utilization", "0.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert round(doc["costs"][0]["cny_per_million"], 2) == 14.82
    assert "30 days" in doc["convention"]


def test_cost_cli_marks_an_estimated_price(capsys: pytest.CaptureFixture[str]):
    assert HARDWARE["c8g.8xlarge"].price_is_estimate
    assert main(["cost", "--instance", "c8g.8xlarge", "--tok-s", "45"]) == 0
    assert "~1,511.50" in capsys.readouterr().out


def test_q1_gpu_quota_gives_the_gpu_stack():
    r = recommend.recommend(gpu_quota=True, priority="cost", figures=REPORT)
    gpu = PROFILES["gpu-mtp"]
    assert (r.stack, r.instance_type, r.mtp) == (gpu.stack_name, "g5.xlarge", True)
    assert r.deploy == "npx cdk deploy GpuMtpStack"
    assert r.tok_s_low == 47.89
    assert f"{r.costs[0].monthly_cny:.2f}" == "2852.33"
    assert f"{r.costs[0].cny_per_million:.2f}" == "22.98"


def test_q2_cost_first_gives_graviton_moe():
    r = recommend.recommend(gpu_quota=False, priority="cost", figures=REPORT)
    assert (r.stack, r.instance_type, r.model, r.mtp) == ("GravitonMoeStack", "c8g.4xlarge", "Qwen3.6-35B-A3B", False)
    assert r.deploy == "npx cdk deploy GravitonMoeStack"
    assert (r.tok_s_low, f"{r.costs[0].monthly_cny:.2f}", f"{r.costs[0].cny_per_million:.2f}") == (
        39.34,
        "755.75",
        "7.41",
    )


def test_headroom_names_the_c8g_8xlarge_stack():
    r = recommend.recommend(gpu_quota=False, priority="headroom", figures=REPORT)
    assert (r.stack, r.instance_type, r.model, r.mtp) == (
        "GravitonMoeHeadroomStack", "c8g.8xlarge", "Qwen3.6-35B-A3B", False,
    )  # fmt: skip
    assert (r.tok_s_low, r.tok_s_high) == (45, 50)
    assert r.deploy == "npx cdk deploy GravitonMoeHeadroomStack"
    assert f"{r.costs[0].monthly_cny:.2f}" == "1511.50"  # the report's "~¥1,500"
    assert all(c.estimate for c in r.costs)
    text = recommend.render(r)
    assert "No stack deploys" not in text
    assert text.endswith("deploy: npx cdk deploy GravitonMoeHeadroomStack")
    assert "~¥11.66 to ¥12.96" in text
    assert "the same monthly cost buys 2.0 x c8g.4xlarge (GravitonMoeStack), 39.34 tok/s each at ¥7.41" in text


def test_headroom_without_its_profile_says_how_to_add_one():
    from dataclasses import replace

    without = {k: v for k, v in PROFILES.items() if k != "graviton-moe-headroom"}
    figures = replace(REPORT, catalog=replace(CATALOG, profiles=without))  # a catalog is passed, never patched
    text = recommend.render(recommend.recommend(gpu_quota=False, priority="headroom", figures=figures))
    assert "No stack deploys c8g.8xlarge yet" in text and "profiles/serving/<name>.toml" in text
    assert "closest deploy: npx cdk deploy GravitonMoeStack" in text


def test_gpu_quota_without_a_measured_gpu_profile_falls_through_to_cpu():
    cpu_only = results.Results(
        CATALOG,
        measurements=[m for m in REPORT.measurements if m.instance_type != "g5.xlarge"],
        estimates=REPORT.estimates,
    )
    r = recommend.recommend(gpu_quota=True, priority="cost", figures=cpu_only)
    assert r.stack == "GravitonMoeStack"


def test_own_figures_can_change_the_cost_winner():
    """The tree decides from the figures it is given, not from a fixed answer."""
    faster_intel = [
        results.Measurement(**{**m.__dict__, "effective_tok_s": 80.0})
        if (m.instance_type, m.model, m.mtp) == ("c8i.4xlarge", "Qwen3.6-35B-A3B", False)
        else m
        for m in REPORT.measurements
    ]
    r = recommend.recommend(
        gpu_quota=False, priority="cost", figures=results.Results(CATALOG, measurements=faster_intel)
    )
    assert r.stack == "IntelMoeStack"


def test_recommend_cli_one_answer_and_the_whole_tree(capsys: pytest.CaptureFixture[str]):
    assert main(["recommend", "--no-gpu-quota", "--priority", "cost"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("deploy: npx cdk deploy GravitonMoeStack")
    assert "39.34 tok/s" in out and "¥755.75" in out and "¥7.41" in out
    assert main(["recommend"]) == 0
    tree = capsys.readouterr().out
    for line in ("deploy: npx cdk deploy GpuMtpStack", "deploy: npx cdk deploy GravitonMoeStack",
                 "deploy: npx cdk deploy GravitonMoeHeadroomStack"):  # fmt: skip
        assert line in tree
    assert main(["recommend", "--gpu-quota", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"] == "GpuMtpStack"
