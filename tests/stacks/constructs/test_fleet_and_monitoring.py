"""The serving fleet and the monitoring, each alone in a bare stack, from the props the stack passes them."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import aws_cdk as cdk
import pytest
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template

from gguf_serve.container.names import DRAIN_HEARTBEAT_S
from stacks.errors import PropsError
from stacks.fleet import DRAIN_HOOK, READY_HOOK, ServingFleet
from stacks.load_balancer import InferenceLoadBalancer
from stacks.monitoring import ServiceMonitoring
from stacks.options import DeployOptions
from stacks.plan import plan_service
from stacks.scaling import FleetScaling
from tests.committed import profile_by_stack
from userdata import DeploySettings, InstanceSpec

ZONES = ("cn-northwest-1a", "cn-northwest-1b")
DEPLOY = DeploySettings(**{f.name: f"<{f.name}>" for f in fields(DeploySettings)})


def _fleet(stack: cdk.Stack, stack_name: str = "IntelMoeStack", **overrides) -> ServingFleet:
    p = profile_by_stack(stack_name)
    port = overrides.pop("port", p.server.port)
    props = {
        "hardware": p.hardware,
        "capacity": p.fleet.capacity,
        "volume": p.fleet.volume,
        "instance": replace(InstanceSpec.of(p), port=port),
        "deploy": DEPLOY,
        "image_tag": "x86-64-cpu-0123456789abcdef",
        "root_volume_gib": p.root_volume_gib,
        "boot_budget_s": p.boot_budget_s,
        "vpc": ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1),
    }
    return ServingFleet(stack, "Fleet", **{**props, **overrides})


def test_instances_get_imdsv2_an_encrypted_gp3_root_of_the_given_size_and_no_ssh_key(regional_stack):
    p = profile_by_stack("IntelMoeStack")
    _fleet(regional_stack)
    t = Template.from_stack(regional_stack)
    t.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {
                    "InstanceType": p.hardware.instance_type,
                    "MetadataOptions": Match.object_like({"HttpTokens": "required"}),
                    "BlockDeviceMappings": [
                        Match.object_like(
                            {
                                "Ebs": Match.object_like(
                                    {"Encrypted": True, "VolumeType": "gp3", "VolumeSize": p.root_volume_gib}
                                )
                            }
                        )
                    ],
                }
            )
        },
    )
    (template,) = t.find_resources("AWS::EC2::LaunchTemplate").values()
    assert "KeyName" not in template["Properties"]["LaunchTemplateData"]


def test_the_fleet_renders_its_boot_script_and_publishes_the_release_it_hashes(regional_stack):
    from userdata.render import release_id

    p = profile_by_stack("IntelMoeStack")
    fleet = _fleet(regional_stack)
    t = Template.from_stack(regional_stack)
    assert fleet.release == release_id(InstanceSpec.of(p), "x86-64-cpu-0123456789abcdef")
    t.has_resource_properties(
        "AWS::SSM::Parameter", {"Value": fleet.release, "Name": Match.string_like_regexp("serving-release")}
    )
    (lt,) = t.find_resources("AWS::EC2::LaunchTemplate").values()
    script = json.dumps(lt["Properties"]["LaunchTemplateData"]["UserData"])
    for rendered in (
        "<image_uri>",
        "<api_key_secret_arn>",
        fleet.release,
        p.model.file,
        f"--slots {p.server.parallel}",
    ):
        assert rendered in script, rendered


EC2_IN_CHINA = ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]  # stacks/principals.py


def test_the_root_volume_performance_and_the_instance_role_come_from_the_props(regional_stack):
    p = profile_by_stack("GpuMtpStack")  # 3000 IOPS and 500 MiB/s, not the fleet defaults
    _fleet(regional_stack, "GpuMtpStack", root_volume_gib=77)
    t = Template.from_stack(regional_stack)
    ebs = {"VolumeSize": 77, "Iops": p.fleet.volume.volume_iops, "Throughput": p.fleet.volume.volume_throughput_mibps}
    t.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {"BlockDeviceMappings": [Match.object_like({"Ebs": Match.object_like(ebs)})]}
            )
        },
    )
    t.has_resource_properties(
        "AWS::IAM::Role",
        {
            "AssumeRolePolicyDocument": Match.object_like(
                {"Statement": [Match.object_like({"Principal": {"Service": EC2_IN_CHINA}})]}
            ),
            "ManagedPolicyArns": [
                {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::aws:policy/AmazonSSMManagedInstanceCore"]]}
            ],
        },
    )


def test_the_group_is_elb_checked_and_waits_for_its_instances_signals_within_the_boot_budget(regional_stack):
    p = profile_by_stack("IntelMoeStack")
    _fleet(regional_stack, boot_budget_s=1234)
    t = Template.from_stack(regional_stack)
    t.has_resource(
        "AWS::AutoScaling::AutoScalingGroup",
        {
            "Properties": Match.object_like(
                {
                    "HealthCheckType": "ELB",
                    "HealthCheckGracePeriod": 1234,
                    "MinSize": str(p.fleet.capacity.min_capacity),
                    "MaxSize": str(p.fleet.capacity.max_capacity),
                    "LaunchTemplate": Match.object_like({"LaunchTemplateId": Match.any_value()}),
                    "LaunchConfigurationName": Match.absent(),
                    "MixedInstancesPolicy": Match.absent(),
                    "CapacityRebalance": Match.absent(),
                }
            ),
            "CreationPolicy": {"ResourceSignal": {"Count": p.fleet.capacity.min_capacity, "Timeout": "PT20M34S"}},
            "UpdatePolicy": Match.object_like(
                {
                    "AutoScalingRollingUpdate": Match.object_like(
                        {"MaxBatchSize": 1, "WaitOnResourceSignals": True, "PauseTime": "PT20M34S"}
                    )
                }
            ),
        },
    )


@pytest.mark.parametrize("min_capacity", [2, 0])
def test_spot_is_capacity_optimized_above_an_on_demand_base_with_rebalancing(regional_stack, min_capacity):
    """The base is what a deploy or a rolling update waits for (min_capacity + rolling_batch); a group that may
    sleep at zero has none (tests/stacks/test_spot.py: the types it spreads over, in the whole app)."""
    capacity = replace(profile_by_stack("IntelMoeStack").fleet.capacity, min_capacity=min_capacity)
    _fleet(regional_stack, capacity=capacity, spot=True)
    base = min_capacity + capacity.rolling_batch if min_capacity else 0
    Template.from_stack(regional_stack).has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup",
        {
            "MixedInstancesPolicy": Match.object_like(
                {
                    "InstancesDistribution": {
                        "OnDemandBaseCapacity": base,
                        "OnDemandPercentageAboveBaseCapacity": 0,
                        "SpotAllocationStrategy": "capacity-optimized",
                    },
                    "LaunchTemplate": Match.object_like({"LaunchTemplateSpecification": Match.any_value()}),
                }
            ),
            "CapacityRebalance": True,
            "LaunchTemplate": Match.absent(),
        },
    )


def _fleet_with_scaling(stack: cdk.Stack, stack_name: str, options: DeployOptions) -> Template:
    """The fleet and its scaling built from the props this stack's plan for `options` gives them (as ServingStack
    passes them)."""
    plan = plan_service(profile_by_stack(stack_name), options, ZONES)
    fleet = _fleet(stack, stack_name, capacity=plan.capacity, spot=plan.spot)
    f = plan.fleet
    FleetScaling(
        stack, "Scaling", capacity=plan.capacity, settings=f.scaling, warmup_s=f.boot.model_load_s, asg=fleet.asg
    )
    return Template.from_stack(stack)


@pytest.mark.parametrize(("stack_name", "spot"), [("IntelMoeStack", True), ("GpuMtpStack", False)])
def test_the_spot_option_gives_a_cpu_fleet_spot_without_a_warm_pool_and_leaves_the_gpu_fleet_as_it_is(
    regional_stack, stack_name, spot
):
    t = _fleet_with_scaling(regional_stack, stack_name, DeployOptions(spot=True))
    (group,) = t.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    assert ("MixedInstancesPolicy" in group["Properties"]) is spot
    t.resource_count_is("AWS::AutoScaling::WarmPool", 0 if spot else 1)


@pytest.mark.parametrize(("warm_pool", "pools"), [(0, 0), (2, 1)])
def test_the_warm_pool_option_sizes_the_pool(regional_stack, warm_pool, pools):
    t = _fleet_with_scaling(regional_stack, "GravitonMoeStack", DeployOptions(warm_pool=warm_pool))
    t.resource_count_is("AWS::AutoScaling::WarmPool", pools)
    if pools:
        t.has_resource_properties("AWS::AutoScaling::WarmPool", {"MinSize": warm_pool})


def test_both_hooks_are_created_with_the_group_and_the_boot_budget(regional_stack):
    p = profile_by_stack("IntelMoeStack")
    _fleet(regional_stack)
    t = Template.from_stack(regional_stack)
    assert not t.find_resources("AWS::AutoScaling::LifecycleHook")  # created after the group: too late
    (group,) = t.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    hooks = {h["LifecycleHookName"]: h for h in group["Properties"]["LifecycleHookSpecificationList"]}
    assert set(hooks) == {READY_HOOK, DRAIN_HOOK}
    assert hooks[READY_HOOK]["HeartbeatTimeout"] == p.boot_budget_s
    assert hooks[READY_HOOK]["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert hooks[READY_HOOK]["DefaultResult"] == "ABANDON"  # an instance that never answers /health never serves
    assert hooks[DRAIN_HOOK]["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert hooks[DRAIN_HOOK]["DefaultResult"] == "CONTINUE"
    # a few missed heartbeats end a drain, not the first late one
    assert DRAIN_HEARTBEAT_S < hooks[DRAIN_HOOK]["HeartbeatTimeout"] <= 4 * DRAIN_HEARTBEAT_S


def test_the_instances_complete_and_heartbeat_only_the_hooks_of_their_own_stacks_group(regional_stack):
    _fleet(regional_stack)
    Template.from_stack(regional_stack).has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": Match.object_like(
                {
                    "Statement": Match.array_with(
                        [
                            {
                                "Action": [
                                    "autoscaling:CompleteLifecycleAction",
                                    "autoscaling:RecordLifecycleActionHeartbeat",
                                ],
                                "Effect": "Allow",
                                "Resource": "arn:aws-cn:autoscaling:cn-northwest-1:111122223333:autoScalingGroup:*:"
                                "autoScalingGroupName/Test-ServingGroup-*",
                            }
                        ]
                    )
                }
            )
        },
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"port": 0}, r"port 0 is not a TCP port"),
        ({"root_volume_gib": 0}, r"0 GiB root volume is outside gp3's 1-16384 GiB"),
        ({"root_volume_gib": 20_000}, r"lower the model size or the fleet's image_headroom_gib"),
        ({"boot_budget_s": 0}, r"boot budget 0 s must be positive"),
        ({"image_tag": ""}, r"image tag '' is not a plain tag; pass ImageBuild.image_tag"),
    ],
)
def test_fleet_props_are_refused_with_what_to_change(regional_stack, override, message):
    with pytest.raises(PropsError, match=message):
        _fleet(regional_stack, **override)


def _monitoring(stack: cdk.Stack, stack_name: str, **overrides) -> Template:
    p = profile_by_stack(stack_name)
    fleet = _fleet(stack, stack_name)
    vpc = stack.node.find_child("Vpc")
    logs = cdk.aws_s3.Bucket(stack, "Logs")
    lb = InferenceLoadBalancer(
        stack, "LoadBalancer", vpc=vpc, vpc_cidr=p.fleet.network.vpc_cidr, access_logs=logs, targets=[fleet.asg],
        target_port=fleet.port,
    )  # fmt: skip
    props = {
        "name": stack_name, "alarms": p.fleet.alarms, "drain_deadline_s": p.fleet.drain.deadline_s,
        "has_gpu": p.hardware.has_gpu, "mtp": p.mtp,
    }  # fmt: skip
    ServiceMonitoring(
        stack, "Monitoring", asg=fleet.asg, alb=lb.alb, target_group=lb.target_group, **{**props, **overrides}
    )
    return Template.from_stack(stack)


def _dashboard_body(t: Template) -> str:
    (dashboard,) = t.find_resources("AWS::CloudWatch::Dashboard").values()
    return json.dumps(dashboard["Properties"]["DashboardBody"])


def test_gpu_and_mtp_widgets_follow_the_props_and_the_name_names_the_dashboard(regional_stack):
    t = _monitoring(regional_stack, "GpuMtpStack")
    t.has_resource_properties("AWS::CloudWatch::Dashboard", {"DashboardName": "GpuMtpStack-llama"})
    body = _dashboard_body(t)
    assert "nvidia_smi_utilization_gpu" in body and "MTP draft acceptance" in body
    assert "DrainStreamsCut" in body and "HTTPCode_ELB_503_Count" in body


def test_a_cpu_stack_without_mtp_has_neither_gpu_nor_mtp_widgets_and_a_wider_ttft_alarm(regional_stack):
    t = _monitoring(regional_stack, "IntelMoeStack")
    body = _dashboard_body(t)
    assert "nvidia_smi" not in body and "MTP draft acceptance" not in body
    descriptions = [a["Properties"]["AlarmDescription"] for a in t.find_resources("AWS::CloudWatch::Alarm").values()]
    assert any(d.startswith("IntelMoeStack: P95 time to first token above 30 s") for d in descriptions), descriptions


def test_the_alarms_page_on_no_healthy_host_5xx_and_a_backlog_and_the_dashboard_graphs_the_service(regional_stack):
    p = profile_by_stack("IntelMoeStack")
    t = _monitoring(regional_stack, "IntelMoeStack")
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmDescription": "IntelMoeStack: no instance passes /health",
            "MetricName": "HealthyHostCount",
            "Threshold": 1,
            "ComparisonOperator": "LessThanThreshold",
            "TreatMissingData": "breaching",
        },
    )
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"AlarmDescription": "IntelMoeStack: more than 5% of requests answered 5xx", "Threshold": 5},
    )
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmDescription": Match.string_like_regexp("^IntelMoeStack: requests queue in llama-server"),
            "MetricName": "RequestsDeferred",
            "Threshold": p.fleet.alarms.deferred_alarm,
        },
    )
    assert not t.find_resources("AWS::CloudWatch::Alarm", {"Properties": {"MetricName": "CPUUtilization"}})
    body = _dashboard_body(t)
    for metric in ("GeneratedTokensPerSecond", "RequestsDeferred", "TargetResponseTime", "HealthyHostCount"):
        assert metric in body, metric


def test_monitoring_refuses_an_empty_name(regional_stack):
    with pytest.raises(PropsError, match=r"name is empty; pass the stack's name"):
        _monitoring(regional_stack, "IntelMoeStack", name="")


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
    t = _monitoring(regional_stack, "IntelMoeStack", sleeps=True, wake_answers=DOOR_ANSWERS)
    alarm = _no_healthy_hosts(t)
    (expression,) = [m["Expression"] for m in alarm["Metrics"] if "Expression" in m]
    assert expression == "IF(FILL(serving, 0) >= 1, FILL(healthy, 0), 1)"
    watched = {m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert watched == {"GroupInServiceInstances", "HealthyHostCount"}
    (dashboard,) = t.find_resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "wake door answers" in body and "targetgroup/door/1" in body


@pytest.mark.parametrize("options", [DeployOptions(off_hours=(20, 8)), DeployOptions(min_capacity=0)])
def test_off_hours_alone_or_no_minimum_alone_count_as_sleeping(regional_stack, options):
    plan = plan_service(profile_by_stack("IntelMoeStack"), options, ZONES)
    assert not plan_service(profile_by_stack("IntelMoeStack"), DeployOptions(), ZONES).sleeps
    alarm = _no_healthy_hosts(_monitoring(regional_stack, "IntelMoeStack", sleeps=plan.sleeps))
    assert "Metrics" in alarm and "MetricName" not in alarm
