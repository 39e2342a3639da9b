"""FleetScaling alone: the warm pool, off hours with and without waking on a request, the wake
alarm and its ExactCapacity step, and the refusal when the wake has no ALB metric to watch."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template

from stacks.errors import PropsError
from stacks.scaling import FleetScaling
from tests.committed import profile_by_stack

FLEET = profile_by_stack("IntelMoeStack").fleet
ELB_503 = cloudwatch.Metric(
    namespace="AWS/ApplicationELB",
    metric_name="HTTPCode_ELB_503_Count",
    statistic="Sum",
    period=cdk.Duration.minutes(1),
)


def _scaled(
    stack: cdk.Stack, with_503: bool = True, off_hours=None, wake_on_request: bool = False, **fleet_changes
) -> Template:
    """FleetScaling as ServingStack builds it: the profile's [fleet] parts (changed by `fleet_changes`, keys as a
    profile file names them) and the two deploy options it reads."""
    fleet = FLEET.changed(**fleet_changes)
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0)
    asg = autoscaling.AutoScalingGroup(
        stack, "Group", vpc=vpc, vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
        instance_type=ec2.InstanceType("c8i.4xlarge"), machine_image=ec2.MachineImage.latest_amazon_linux2023(),
    )  # fmt: skip
    FleetScaling(
        stack, "Scaling", capacity=fleet.capacity, settings=fleet.scaling, warmup_s=fleet.boot.model_load_s,
        off_hours=off_hours, wake_on_request=wake_on_request, asg=asg, no_target_503=ELB_503 if with_503 else None,
    )  # fmt: skip
    return Template.from_stack(stack)


def test_the_warm_pool_keeps_stopped_instances_and_takes_them_back_on_scale_in(stack):
    t = _scaled(stack, warm_pool_size=1)
    t.has_resource_properties(
        "AWS::AutoScaling::WarmPool",
        {"MinSize": 1, "PoolState": "Stopped", "InstanceReusePolicy": {"ReuseOnScaleIn": True}},
    )


def test_off_hours_without_wake_hold_the_group_at_zero(stack):
    t = _scaled(stack, off_hours=(20, 8), wake_on_request=False)
    t.has_resource_properties(
        "AWS::AutoScaling::ScheduledAction",
        {"Recurrence": "0 20 * * MON-FRI", "MinSize": 0, "MaxSize": 0, "TimeZone": "Asia/Shanghai"},
    )
    assert not t.find_resources("AWS::CloudWatch::Alarm", {"Properties": {"Metrics": Match.any_value()}})


def test_off_hours_with_wake_bring_the_group_to_zero_and_a_refused_request_sets_it_to_one(stack):
    t = _scaled(stack, off_hours=(20, 8), wake_on_request=True)
    t.has_resource_properties(
        "AWS::AutoScaling::ScheduledAction",
        {"Recurrence": "0 20 * * MON-FRI", "MinSize": 0, "MaxSize": FLEET.capacity.max_capacity, "DesiredCapacity": 0},
    )
    t.has_resource_properties(
        "AWS::AutoScaling::ScalingPolicy",
        {
            "AdjustmentType": "ExactCapacity",
            "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
        },
    )
    alarms = t.find_resources("AWS::CloudWatch::Alarm", {"Properties": {"Metrics": Match.any_value()}})
    (wake,) = [a["Properties"] for a in alarms.values() if "scale to one" in a["Properties"]["AlarmDescription"]]
    expression = next(m["Expression"] for m in wake["Metrics"] if "Expression" in m)
    assert expression == "IF(FILL(served, 0) < 1 AND FILL(refused, 0) > 0, 1, 0)"
    watched = {m["MetricStat"]["Metric"]["MetricName"] for m in wake["Metrics"] if "MetricStat" in m}
    assert watched == {"GroupInServiceInstances", "HTTPCode_ELB_503_Count"}
    assert wake["EvaluationPeriods"] == 1 and wake["Threshold"] == 1


def test_wake_on_request_without_the_alb_metric_is_refused(stack):
    with pytest.raises(PropsError, match=r"wake_on_request needs the load balancer's HTTPCode_ELB_503_Count"):
        _scaled(stack, with_503=False, wake_on_request=True)


def test_scales_on_llama_cpp_signals_not_cpu(stack):
    """Target tracking on busy slots at the fleet's ratio; steps on queued and shed requests; nothing on CPU (a CPU
    stack is always 100% busy while it generates)."""
    t = _scaled(stack, target_busy_slot_ratio=0.5)
    policies = [r["Properties"] for r in t.find_resources("AWS::AutoScaling::ScalingPolicy").values()]
    (tracking,) = [x["TargetTrackingConfiguration"] for x in policies if x["PolicyType"] == "TargetTrackingScaling"]
    metric = tracking["CustomizedMetricSpecification"]
    assert (metric["MetricName"], metric["Namespace"], tracking["TargetValue"]) == (
        "SlotsBusyRatio", "GgufServe/LlamaServer", 50
    )  # fmt: skip
    steps = [x for x in policies if x["PolicyType"] == "StepScaling"]
    assert len(steps) == 2 and all(x["AdjustmentType"] == "ChangeInCapacity" for x in steps)
    alarms = [r["Properties"] for r in t.find_resources("AWS::CloudWatch::Alarm").values()]
    by_metric = {a.get("MetricName"): a for a in alarms}
    assert by_metric["RequestsDeferred"]["Statistic"] == "Maximum" and by_metric["RequestsDeferred"]["AlarmActions"]
    assert by_metric["RequestsShed"]["Statistic"] == "Sum" and by_metric["RequestsShed"]["AlarmActions"]
    assert "CPUUtilization" not in by_metric
