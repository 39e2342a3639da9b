"""ServiceMonitoring for a group that sleeps (offHours, minCapacity 0): no false NoHealthyHosts alarm at zero, and
the wake door's answers on the wake-ups widget."""

from __future__ import annotations

import json
from dataclasses import replace

from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk.assertions import Template

from tests.committed import profile_by_stack
from tests.stacks.constructs.test_fleet_and_monitoring import _monitoring

DOOR_ANSWERS = cloudwatch.Metric(
    namespace="AWS/ApplicationELB", metric_name="RequestCount", dimensions_map={"TargetGroup": "targetgroup/door/1"}
)


def _no_healthy_hosts(t: Template) -> dict:
    (alarm,) = [
        a["Properties"]
        for a in t.find_resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"]["AlarmDescription"].endswith("no instance passes /health")
    ]
    return alarm


def test_an_always_on_group_alarms_on_no_healthy_host_and_on_no_data(regional_stack):
    alarm = _no_healthy_hosts(_monitoring(regional_stack, "IntelMoeStack"))
    assert alarm["MetricName"] == "HealthyHostCount" and alarm["TreatMissingData"] == "breaching"


def test_a_group_that_sleeps_alarms_only_while_instances_are_in_service(regional_stack):
    fleet = replace(profile_by_stack("IntelMoeStack").fleet, min_capacity=0, wake_on_request=True)
    t = _monitoring(regional_stack, "IntelMoeStack", fleet=fleet, wake_answers=DOOR_ANSWERS)
    alarm = _no_healthy_hosts(t)
    (expression,) = [m["Expression"] for m in alarm["Metrics"] if "Expression" in m]
    assert expression == "IF(FILL(serving, 0) >= 1, FILL(healthy, 0), 1)"
    watched = {m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert watched == {"GroupInServiceInstances", "HealthyHostCount"}
    (dashboard,) = t.find_resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "wake door answers" in body and "targetgroup/door/1" in body


def test_off_hours_alone_also_counts_as_sleeping(regional_stack):
    fleet = replace(profile_by_stack("IntelMoeStack").fleet, off_hours=(20, 8))
    alarm = _no_healthy_hosts(_monitoring(regional_stack, "IntelMoeStack", fleet=fleet))
    assert "Metrics" in alarm and "MetricName" not in alarm
