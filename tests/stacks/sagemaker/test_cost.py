"""Each SageMaker endpoint's dashboard shows what its tokens cost (stacks/fleet_cost.py): instances counted by the
container's own datums (one per EMF interval each), priced at the ml type's hourly price, beside the report's rate
on the EC2 type a twin replaces (the same CPU). Evaluated with the fleet tests' evaluator of metric math."""

from __future__ import annotations

import json
import re

import pytest

from tests.stacks.constructs.test_fleet_cost import evaluate
from tests.stacks.eks.conftest import flat


def _dashboard(app, stack: str) -> dict:
    template = app.template(stack)
    (board,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    return json.loads(re.sub(r"<[^>]+>", "X", flat(board["Properties"]["DashboardBody"])))


def _cost_widget(board: dict) -> dict:
    return next(w for w in board["widgets"] if w["properties"].get("title", "").startswith("¥ per million"))


@pytest.mark.parametrize("stack", ["GravitonMoeSageMakerStack", "C5MoeSageMakerStack"])
def test_each_endpoint_dashboard_prices_its_tokens_from_its_own_instances(whole_apps, stack):
    board = _dashboard(whole_apps["committed"], stack)
    widget = _cost_widget(board)
    assert "priced On-Demand" in widget["properties"]["title"]
    rows = widget["properties"]["metrics"]
    daily = next(r[0]["expression"] for r in rows if isinstance(r[0], dict) and "daily" in r[0].get("label", ""))
    assert "(units_d * 60 / 86400)" in daily  # SampleCount of one datum per instance a minute, over a day
    counted = [r for r in rows if "SampleCount" in json.dumps(r)]
    assert counted, rows
    # Two instances all day, 1,000,000 tokens: the ml type's price x 48 instance-hours.
    hourly = float(re.search(r"\* ([0-9.]+) \* 24", daily).group(1))
    assert evaluate(daily, {"units_d": 2 * 1440, "tokens_d": 1e6}) == pytest.approx(hourly * 48)


def test_a_twin_shows_the_reports_rate_on_the_ec2_type_it_replaces(whole_apps):
    board = _dashboard(whole_apps["committed"], "GravitonMoeSageMakerStack")
    annotation = _cost_widget(board)["properties"]["annotations"]["horizontal"][0]
    assert "the report's 39.34 tok/s on c8g.4xlarge, priced as ml.c8g.4xlarge" in annotation["label"]
