"""The stacks' P95 TTFT alarm and percentile widgets read what the metrics publisher publishes (names, namespace)."""

from __future__ import annotations

import json

import pytest

from gguf_serve.container.metrics import names
from stacks.monitoring import TTFT_P95_ALARM_S
from tests.committed import profile_by_stack


@pytest.fixture(scope="module")
def templates(whole_apps) -> dict[str, dict]:
    """The committed options' templates, the fast tier's shared synthesis (tests/whole_app.py)."""
    return {name: whole_apps["committed"].template(name) for name in ("GpuMtpStack", "GravitonMoeStack")}


@pytest.mark.parametrize("stack", ["GpuMtpStack", "GravitonMoeStack"])
def test_p95_ttft_alarm_on_the_fleet_distribution(templates, stack) -> None:
    t = templates[stack]
    alarms = [r["Properties"] for r in t["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    (ttft,) = [a for a in alarms if a.get("MetricName") == names.TTFT]
    assert ttft["Namespace"] == names.NAMESPACE and ttft["ExtendedStatistic"] == "p95"
    assert [d["Name"] for d in ttft["Dimensions"]] == [names.DIM_GROUP]  # the group level: fleet-wide p95
    assert ttft["Period"] == 300 and ttft["EvaluationPeriods"] == 3
    gpu = profile_by_stack(stack).hardware.has_gpu
    assert ttft["Threshold"] == TTFT_P95_ALARM_S["gpu" if gpu else "cpu"]
    assert ttft["TreatMissingData"] == "notBreaching"  # no requests: no latency, no alarm


@pytest.mark.parametrize("stack", ["GpuMtpStack", "GravitonMoeStack"])
def test_dashboard_graphs_fleet_percentiles(templates, stack) -> None:
    dashboards = [r for r in templates[stack]["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    body = json.dumps(dashboards[0]["Properties"]["DashboardBody"])
    for metric in (names.TTFT, names.INTER_TOKEN_LATENCY, names.QUEUE_WAIT, names.DECODE_TPS):
        assert metric in body
    for p in ("p50", "p95", "p99"):
        assert f"{names.TTFT} {p}" in body  # the widget's label for each fleet percentile
