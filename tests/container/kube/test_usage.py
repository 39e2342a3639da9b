"""What an EKS profile's scaler publishes for its live cost (gguf_serve/container/kube/usage.py): the nodes, the
output tokens its pods relayed (the increase of each hop's counter) and the busy slots, one PutMetricData per
interval, read back from moto's CloudWatch as the dashboard's metrics name them (stacks/eks/monitoring.py)."""

from __future__ import annotations

import datetime as dt
import logging

import boto3
import pytest
from moto import mock_aws

from gguf_serve.container.kube.usage import FleetUsage
from gguf_serve.container.metrics import names
from stacks.eks.monitoring import usage_metric

PROFILE = "EksServingStack/graviton-moe"


class _Put:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, **kw) -> None:
        self.calls.append(kw)


def _values(call: dict) -> dict[str, float]:
    return {d["MetricName"]: d["Value"] for d in call["MetricData"]}


def test_an_interval_publishes_the_nodes_the_tokens_increase_and_the_busy_slots() -> None:
    put = _Put()
    usage = FleetUsage(put, PROFILE, slots=2, interval_s=60)
    usage.observe(0, nodes=2, tokens_total={"a": 1000, "b": 50}, processing=1)  # counts before this: not ours
    usage.observe(30, nodes=2, tokens_total={"a": 1200, "b": 80}, processing=3)
    assert put.calls == []
    usage.observe(60, nodes=3, tokens_total={"a": 1300, "b": 80, "c": 7}, processing=0)  # c: new, from now on
    [call] = put.calls
    assert call["Namespace"] == names.NAMESPACE
    assert all(d["Dimensions"] == [{"Name": names.DIM_EKS_PROFILE, "Value": PROFILE}] for d in call["MetricData"])
    v = _values(call)
    assert v[names.OUTPUT_TOKENS] == 200 + 30 + 100
    assert v[names.SERVING_NODES] == pytest.approx((2 + 2 + 3) / 3)
    assert v[names.SLOTS_BUSY_RATIO] == pytest.approx((25 + 75 + 0) / 3)
    usage.observe(90, nodes=3, tokens_total={"a": 40, "c": 17}, processing=0)  # a restarted: its 40 count
    usage.observe(120, nodes=3, tokens_total={"a": 40, "c": 17}, processing=0)
    assert _values(put.calls[1])[names.OUTPUT_TOKENS] == 40 + 10


def test_nodes_without_a_pod_to_scrape_still_cost_and_say_no_utilization() -> None:
    put = _Put()
    usage = FleetUsage(put, PROFILE, slots=2, interval_s=60)
    usage.observe(0, nodes=1, tokens_total={}, processing=0)
    usage.observe(60, nodes=1, tokens_total={}, processing=0)
    v = _values(put.calls[0])
    assert v == {names.SERVING_NODES: 1, names.OUTPUT_TOKENS: 0}


def test_a_refused_publication_is_one_warning_and_the_next_interval_goes_on(caplog) -> None:
    calls = []

    def refuse(**kw) -> None:
        calls.append(kw)
        if len(calls) == 1:
            raise RuntimeError("AccessDenied")

    usage = FleetUsage(refuse, PROFILE, slots=1, interval_s=60)
    with caplog.at_level(logging.WARNING):
        for t in (0, 60, 120):
            usage.observe(t, nodes=1, tokens_total={"a": t}, processing=1)
    assert len(calls) == 2 and "not published: RuntimeError: AccessDenied" in caplog.text
    assert _values(calls[1])[names.OUTPUT_TOKENS] == 60  # the second interval's own, not the lost one's


@mock_aws
def test_what_it_puts_is_what_the_dashboard_reads() -> None:
    cloudwatch = boto3.client("cloudwatch", region_name="cn-northwest-1")
    usage = FleetUsage(cloudwatch.put_metric_data, PROFILE, slots=2, interval_s=60)
    usage.observe(0, nodes=2, tokens_total={"a": 0}, processing=2)
    usage.observe(60, nodes=2, tokens_total={"a": 5000}, processing=2)
    now = dt.datetime.now(dt.UTC)
    for name, stat, want in ((names.OUTPUT_TOKENS, "Sum", 5000), (names.SERVING_NODES, "Average", 2),
                             (names.SLOTS_BUSY_RATIO, "Average", 100)):  # fmt: skip
        m = usage_metric(PROFILE, name, stat)
        dims = [{"Name": k, "Value": v} for k, v in m.dimensions.items()]
        got = cloudwatch.get_metric_statistics(
            Namespace=m.namespace, MetricName=m.metric_name, Dimensions=dims, StartTime=now - dt.timedelta(hours=1),
            EndTime=now + dt.timedelta(minutes=1), Period=3600, Statistics=[stat],
        )["Datapoints"]  # fmt: skip
        assert [p[stat] for p in got] == [want], name
