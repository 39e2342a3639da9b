"""WakeDoor alone: the weighted rule every request matches, the door's Lambda target group, the function's events,
schedule and least-privilege policy, and its prop check."""

from __future__ import annotations

import pytest
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk.assertions import Match, Template

from stacks.errors import PropsError
from stacks.wake_door import GROUP_EVENTS, WOKEN_TAG, WakeDoor


def _build(stack, wake_s: int = 382) -> WakeDoor:
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0)
    alb = elbv2.ApplicationLoadBalancer(stack, "Alb", vpc=vpc)
    listener = alb.add_listener("Http", port=80, open=False)
    asg = autoscaling.AutoScalingGroup(
        stack, "Group", vpc=vpc, vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
        instance_type=ec2.InstanceType("c8i.4xlarge"), machine_image=ec2.MachineImage.latest_amazon_linux2023(),
        min_capacity=0,
    )  # fmt: skip
    servers = listener.add_targets("Servers", port=8080, targets=[asg])
    key = secretsmanager.Secret(stack, "ApiKey")
    return WakeDoor(stack, "WakeDoor", listener=listener, servers=servers, asg=asg, wake_s=wake_s, api_key=key)


def _ref(t: Template, kind: str, path_part: str) -> str:
    (logical,) = [k for k in t.find_resources(kind) if path_part in k]
    return logical


def test_one_rule_forwards_every_request_to_the_servers_and_none_to_the_door(regional_stack):
    _build(regional_stack)
    t = Template.from_stack(regional_stack)
    door_tg = _ref(t, "AWS::ElasticLoadBalancingV2::TargetGroup", "WakeDoor")
    servers_tg = _ref(t, "AWS::ElasticLoadBalancingV2::TargetGroup", "Servers")
    t.has_resource_properties(
        "AWS::ElasticLoadBalancingV2::ListenerRule",
        {
            "Priority": 1,
            "Conditions": [{"Field": "path-pattern", "PathPatternConfig": {"Values": ["/*"]}}],
            "Actions": [
                {
                    "Type": "forward",
                    "ForwardConfig": {
                        "TargetGroups": [
                            {"TargetGroupArn": {"Ref": servers_tg}, "Weight": 1},
                            {"TargetGroupArn": {"Ref": door_tg}, "Weight": 0},
                        ]
                    },
                }
            ],
        },
    )
    t.has_resource_properties(
        "AWS::ElasticLoadBalancingV2::TargetGroup", {"TargetType": "lambda", "Targets": [Match.any_value()]}
    )
    t.has_resource_properties(
        "AWS::Lambda::Permission",
        {
            "Action": "lambda:InvokeFunction",
            "Principal": "elasticloadbalancing.amazonaws.com",
            "SourceAccount": {"Ref": "AWS::AccountId"},
        },
    )


def test_the_function_knows_the_group_listener_servers_and_wake_time_but_not_the_rule(regional_stack):
    _build(regional_stack, wake_s=393)
    t = Template.from_stack(regional_stack)
    (fn,) = [
        r["Properties"]
        for r in t.find_resources("AWS::Lambda::Function").values()
        if r["Properties"].get("Runtime") == "python3.13"
    ]
    env = fn["Environment"]["Variables"]
    assert set(env) == {"GROUP_NAME", "LISTENER_ARN", "SERVERS_TARGET_GROUP_ARN", "WAKE_S", "WOKEN_TAG",
                        "API_KEY_SECRET_ARN"}  # fmt: skip
    assert env["API_KEY_SECRET_ARN"] == {"Ref": _ref(t, "AWS::SecretsManager::Secret", "ApiKey")}
    assert env["WAKE_S"] == "393" and env["WOKEN_TAG"] == WOKEN_TAG
    assert "def handler(event, context):" in fn["Code"]["ZipFile"]
    # The rule depends on the door's target group, which depends on the function: the function cannot name it.
    assert "ListenerRule" not in str(env)


def test_group_events_and_a_schedule_trigger_it(regional_stack):
    _build(regional_stack)
    t = Template.from_stack(regional_stack)
    t.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.autoscaling"],
                "detail-type": GROUP_EVENTS,
                "detail": {"AutoScalingGroupName": [{"Ref": Match.string_like_regexp("Group")}]},
            },
            "Targets": [Match.object_like({"RetryPolicy": {"MaximumRetryAttempts": 2}})],
        },
    )
    t.has_resource_properties("AWS::Events::Rule", {"ScheduleExpression": "rate(5 minutes)"})


def test_it_may_change_only_its_group_and_its_rule(regional_stack):
    _build(regional_stack)
    t = Template.from_stack(regional_stack)
    (policy,) = [
        r["Properties"] for k, r in t.find_resources("AWS::IAM::Policy").items() if k.startswith("WakeDoorPolicy")
    ]
    by_action = {
        a: s
        for s in policy["PolicyDocument"]["Statement"]
        for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
    }
    rule = _ref(t, "AWS::ElasticLoadBalancingV2::ListenerRule", "WakeDoor")
    assert by_action["elasticloadbalancing:ModifyRule"]["Resource"] == {"Ref": rule}
    group_arn = str(by_action["autoscaling:SetDesiredCapacity"]["Resource"])
    assert "autoScalingGroupName/" in group_arn and "GroupASG" in group_arn
    assert by_action["autoscaling:CreateOrUpdateTags"] is by_action["autoscaling:SetDesiredCapacity"]
    wildcard = {a for a, s in by_action.items() if s["Resource"] == "*"}
    assert wildcard == {
        "autoscaling:DescribeAutoScalingGroups",
        "elasticloadbalancing:DescribeRules",
        "elasticloadbalancing:DescribeTargetHealth",
    }


def test_it_may_read_the_api_key_and_no_other_secret(regional_stack):
    _build(regional_stack)
    t = Template.from_stack(regional_stack)
    key = _ref(t, "AWS::SecretsManager::Secret", "ApiKey")
    reads = [
        s
        for r in t.find_resources("AWS::IAM::Policy").values()
        for s in r["Properties"]["PolicyDocument"]["Statement"]
        if "secretsmanager:GetSecretValue" in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
    ]
    assert [s["Resource"] for s in reads] == [{"Ref": key}]


@pytest.mark.parametrize("wake_s", [0, 3601])
def test_a_wake_time_out_of_range_is_refused_with_what_to_check(regional_stack, wake_s):
    with pytest.raises(PropsError, match=rf"wake-up of {wake_s} s is outside 1-3600 s; check the profile's boot"):
        _build(regional_stack, wake_s=wake_s)
