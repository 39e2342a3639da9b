"""The rule every target keeps, held over the whole app: each fleet that bills by the hour (an EC2 Auto Scaling group,
a SageMaker endpoint, an EKS profile's nodes) has a dashboard pricing its output tokens live, through the one helper
(stacks/fleet_cost.py). A target added without it fails here."""

from __future__ import annotations

import json
import re

import pytest

from tests.stacks.eks.conftest import PROFILES, flat

PRICED = "¥ per million output tokens served"


def _priced_widgets(template: dict) -> int:
    count = 0
    for r in template["Resources"].values():
        if r["Type"] == "AWS::CloudWatch::Dashboard":
            body = json.loads(re.sub(r"<[^>]+>", "X", flat(r["Properties"]["DashboardBody"])))
            count += sum(w["properties"].get("title", "").startswith(PRICED) for w in body["widgets"])
    return count


def _fleets(template: dict) -> int:
    kinds = [r["Type"] for r in template["Resources"].values()]
    return kinds.count("AWS::AutoScaling::AutoScalingGroup") + kinds.count("AWS::SageMaker::Endpoint")


@pytest.mark.parametrize("option_set", ["committed", "beijing-cost-saver"])
def test_every_ec2_and_sagemaker_fleet_prices_its_tokens(whole_apps, option_set):
    app = whole_apps[option_set]
    serving = {s: _fleets(app.template(s)) for s in app.stacks}
    serving = {s: n for s, n in serving.items() if n}
    assert any("SageMaker" in s for s in serving) and any("SageMaker" not in s for s in serving)
    assert {s: _priced_widgets(app.template(s)) for s in serving} == serving


def test_every_eks_profile_prices_its_tokens(eks_template):
    assert _priced_widgets(eks_template) == len(PROFILES)


def test_every_fleet_behind_a_shared_endpoint_prices_its_tokens(shared_templates):
    serving = {s: n for s, t in shared_templates.items() if (n := _fleets(t))}
    assert len(serving) == 3  # the three EC2 stacks; the shared stack runs no fleet
    assert {s: _priced_widgets(shared_templates[s]) for s in serving} == serving
