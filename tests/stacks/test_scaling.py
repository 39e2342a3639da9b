"""stacks.scaling.step_scale_out makes what scale_on_metric makes, minus the ignored cooldown it warned about."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template

from stacks.scaling import group_metric, step_scale_out

STEPS = [(1, 1), (4, 2)]


def _group(stack: cdk.Stack) -> autoscaling.AutoScalingGroup:
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0)
    return autoscaling.AutoScalingGroup(
        stack,
        "Group",
        vpc=vpc,
        vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
        instance_type=ec2.InstanceType("c7i.large"),
        machine_image=ec2.MachineImage.latest_amazon_linux2023(),
    )


def _policies_and_alarms(stack: cdk.Stack) -> dict:
    res = Template.from_stack(stack).to_json()["Resources"]
    kinds = ("AWS::AutoScaling::ScalingPolicy", "AWS::CloudWatch::Alarm")
    return {k: v for k, v in res.items() if v["Type"] in kinds}


@pytest.mark.parametrize("statistic", ["Maximum", "Sum"])
def test_same_resources_and_logical_ids_as_scale_on_metric(statistic):
    theirs, ours = cdk.Stack(cdk.App(), "Scaling"), cdk.Stack(cdk.App(), "Scaling")  # one name: the same tags
    warmup = cdk.Duration.seconds(300)
    group = _group(theirs)
    group.scale_on_metric(
        "Deferred",
        metric=group_metric(group, "RequestsDeferred", statistic),
        scaling_steps=[
            autoscaling.ScalingInterval(upper=0, change=0),
            *(autoscaling.ScalingInterval(lower=lower, change=change) for lower, change in STEPS),
        ],
        adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
        evaluation_periods=2,
        estimated_instance_warmup=warmup,
    )
    group = _group(ours)
    step_scale_out(
        group,
        "Deferred",
        metric=group_metric(group, "RequestsDeferred", statistic),
        steps=STEPS,
        evaluation_periods=2,
        warmup=warmup,
    )
    expected, got = _policies_and_alarms(theirs), _policies_and_alarms(ours)
    assert len(expected) == 2
    assert got == expected
