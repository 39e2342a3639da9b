"""The serving fleet and the monitoring, each alone in a bare stack, from the props the stack passes them."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template

from catalog.errors import ProfileError
from stacks.fleet import DRAIN_HOOK, READY_HOOK, ServingFleet
from stacks.load_balancer import InferenceLoadBalancer
from stacks.monitoring import ServiceMonitoring
from tests.committed import profile_by_stack
from userdata import DeploySettings, InstanceSpec

DEPLOY = DeploySettings(**{f.name: f"<{f.name}>" for f in fields(DeploySettings)})


def _fleet(stack: cdk.Stack, stack_name: str = "IntelMoeStack", **overrides) -> ServingFleet:
    p = profile_by_stack(stack_name)
    port = overrides.pop("port", p.server.port)
    props = {
        "hardware": p.hardware,
        "fleet": p.fleet,
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
    assert hooks[DRAIN_HOOK]["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert hooks[DRAIN_HOOK]["DefaultResult"] == "CONTINUE"


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
    with pytest.raises(ProfileError, match=message):
        _fleet(regional_stack, **override)


def _monitoring(stack: cdk.Stack, stack_name: str, **overrides) -> Template:
    p = profile_by_stack(stack_name)
    fleet = _fleet(stack, stack_name)
    vpc = stack.node.find_child("Vpc")
    logs = cdk.aws_s3.Bucket(stack, "Logs")
    lb = InferenceLoadBalancer(
        stack, "LoadBalancer", vpc=vpc, vpc_cidr=p.fleet.vpc_cidr, access_logs=logs, targets=[fleet.asg],
        target_port=fleet.port,
    )  # fmt: skip
    props = {"name": stack_name, "fleet": p.fleet, "has_gpu": p.hardware.has_gpu, "mtp": p.mtp}
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


def test_monitoring_refuses_an_empty_name(regional_stack):
    with pytest.raises(ValueError, match=r"name is empty; pass the stack's name"):
        _monitoring(regional_stack, "IntelMoeStack", name="")
