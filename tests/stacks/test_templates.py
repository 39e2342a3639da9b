"""Each synthesized stack: how its profile's values reach the template and how the stack wires its constructs
(grants, the user data's names, outputs). What one construct builds from its props is tested on that construct
alone (tests/stacks/constructs/); what a deploy option does, there and in test_deploy_options.py."""

from __future__ import annotations

import base64
import json
import re

import pytest
from aws_cdk.assertions import Template

from tests.committed import PROFILES, profile_by_stack
from tests.stacks.conftest import STACK_NAMES


def resources(template: Template, kind: str) -> dict:
    return template.find_resources(kind)


def only(template: Template, kind: str) -> dict:
    found = resources(template, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return next(iter(found.values()))["Properties"]


def hook(template: Template, transition: str) -> dict:
    """The one lifecycle hook of a transition (LAUNCHING, TERMINATING)."""
    group = only(template, "AWS::AutoScaling::AutoScalingGroup")
    found = [
        h
        for h in group.get("LifecycleHookSpecificationList", [])
        if h["LifecycleTransition"] == f"autoscaling:EC2_INSTANCE_{transition}"
    ]
    assert len(found) == 1, f"expected one {transition} hook, found {len(found)}"
    return found[0]


def user_data(template: Template) -> str:
    """The launch template's user data with CloudFormation intrinsics shown as <ref>."""
    lt = only(template, "AWS::EC2::LaunchTemplate")
    joined = lt["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    if isinstance(joined, str):
        return joined
    return "".join(p if isinstance(p, str) else "<ref>" for p in joined["Fn::Join"][1])


def embedded_profile(template: Template) -> dict:
    m = re.search(r'echo ([A-Za-z0-9+/=]+) \| base64 -d > "/etc/gguf-serve/runtime.json"', user_data(template))
    assert m, "user data does not write the profile"
    return json.loads(base64.b64decode(m.group(1)))


@pytest.mark.parametrize("stack", STACK_NAMES)
class TestEachStack:
    def test_instance_type_and_ami_architecture(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        data = only(t, "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
        assert data["InstanceType"] == p.hardware.instance_type
        params = t.to_json()["Parameters"]
        ami = [v for v in params.values() if v["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"]
        assert [a["Default"] for a in ami] == [p.hardware.ami_ssm_parameter]
        arch = "arm64" if p.hardware.architecture.value == "arm64" else "x86_64"
        assert arch in p.hardware.ami_ssm_parameter

    def test_the_root_volume_reads_at_the_profiles_speed(self, templates, stack):
        """Its size: test_first_deploy.py; that it is encrypted gp3: the fleet's construct test."""
        t, p = templates[stack], profile_by_stack(stack)
        (volume,) = only(t, "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["BlockDeviceMappings"]
        assert (volume["Ebs"]["Iops"], volume["Ebs"]["Throughput"]) == (
            p.fleet.volume.volume_iops, p.fleet.volume.volume_throughput_mibps
        )  # fmt: skip

    def test_the_alb_keeps_the_slowest_answer_and_targets_the_servers_port(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        alb = only(t, "AWS::ElasticLoadBalancingV2::LoadBalancer")
        attrs = {a["Key"]: a["Value"] for a in alb["LoadBalancerAttributes"]}
        assert int(attrs["idle_timeout.timeout_seconds"]) > 2048 / 4.56  # the report's slowest generation
        logs = next(k for k in resources(t, "AWS::S3::Bucket") if k.startswith("AccessLogs"))
        assert attrs["access_logs.s3.bucket"] == {"Ref": logs}  # the stack's access-log bucket
        tg = only(t, "AWS::ElasticLoadBalancingV2::TargetGroup")
        assert tg["Port"] == p.server.port
        tg_attrs = {a["Key"]: a["Value"] for a in tg["TargetGroupAttributes"]}
        assert (
            int(tg_attrs["deregistration_delay.timeout_seconds"]) == p.fleet.load_balancer.deregistration_delay_s >= 450
        )

    def test_the_group_waits_for_the_profiles_minimum(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        (asg,) = resources(t, "AWS::AutoScaling::AutoScalingGroup").values()
        assert asg["CreationPolicy"]["ResourceSignal"]["Count"] == p.fleet.capacity.min_capacity
        assert (asg["Properties"]["MinSize"], asg["Properties"]["MaxSize"]) == (
            str(p.fleet.capacity.min_capacity), str(p.fleet.capacity.max_capacity)
        )  # fmt: skip

    def test_only_the_alb_reaches_the_server_port(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        sgs = t.to_json()["Resources"]
        instance_sg = next(
            k for k, v in sgs.items() if v["Type"] == "AWS::EC2::SecurityGroup" and k.startswith("Fleet")
        )
        alb_sg = next(
            k for k, v in sgs.items() if v["Type"] == "AWS::EC2::SecurityGroup" and k.startswith("LoadBalancer")
        )
        ingress = [
            v["Properties"]
            for v in sgs.values()
            if v["Type"] == "AWS::EC2::SecurityGroupIngress"
            and v["Properties"]["GroupId"] == {"Fn::GetAtt": [instance_sg, "GroupId"]}
        ]
        assert len(ingress) == 1
        rule = ingress[0]
        assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", p.server.port, p.server.port)
        assert rule["SourceSecurityGroupId"] == {"Fn::GetAtt": [alb_sg, "GroupId"]}
        inline = sgs[instance_sg]["Properties"].get("SecurityGroupIngress", [])
        assert inline == []
        for v in sgs.values():
            for rule in v.get("Properties", {}).get("SecurityGroupIngress", []) or []:
                assert rule.get("CidrIp") != "0.0.0.0/0"

    def test_mtp_only_on_the_gpu_profile(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        embedded = embedded_profile(t)
        assert embedded["name"] == p.name
        spec = embedded["server"]["speculative"]
        if p.hardware.has_gpu:
            assert spec == {"spec_type": "draft-mtp", "draft_n_max": 2}
            assert embedded["server"]["parallel"] == 1
            assert "--gpus all" in user_data(t)
        else:
            assert spec is None
            assert "--gpus" not in user_data(t)
        assert "LLAMA_ARG_SPEC" not in user_data(t)  # nothing speculative is inherited through the environment

    def test_api_key_comes_from_secrets_manager(self, templates, stack):
        t = templates[stack]
        only(t, "AWS::SecretsManager::Secret")
        ud = user_data(t)
        assert "secretsmanager get-secret-value" in ud
        assert "LLAMA_API_KEY=" not in ud.replace("LLAMA_API_KEY=%s", "")

    def test_outputs(self, templates, stack):
        outputs = templates[stack].to_json()["Outputs"]
        assert {"EndpointUrl", "ApiKeySecretArn", "CurlExample"} <= set(outputs)
        curl = json.dumps(outputs["CurlExample"]["Value"])
        assert "/v1/chat/completions" in curl and "Authorization: Bearer" in curl


def test_stacks_named_as_users_type_them(committed):
    ec2 = ["GravitonMoeStack", "IntelMoeStack", "GpuMtpStack", "GravitonMoeHeadroomStack"]
    sagemaker = [name.removesuffix("Stack") + "SageMakerStack" for name in ec2]  # docs/sagemaker.md
    endpoints = ["C5MoeSageMakerStack", "G4dnMoeSageMakerStack"]  # profiles/sagemaker/: Ningxia's hosted types
    assert committed.stacks == sorted(ec2 + sagemaker + endpoints)
    assert {p.stack_name for p in PROFILES.values()} == set(STACK_NAMES)


@pytest.mark.parametrize("stack", STACK_NAMES)
class TestOperatingAtScale:
    def test_the_warm_pool_is_the_profiles_and_the_user_data_completes_the_groups_ready_hook(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        assert only(t, "AWS::AutoScaling::WarmPool")["MinSize"] == p.fleet.capacity.warm_pool_size
        ready = hook(t, "LAUNCHING")
        text = user_data(t)  # the hook's name quoted once into LAUNCH_HOOK, which the readiness script uses
        assert (
            f"\nLAUNCH_HOOK={ready['LifecycleHookName']}\n" in text and '--lifecycle-hook-name "\\$LAUNCH_HOOK"' in text
        )

    def test_the_user_data_drains_on_the_groups_drain_hook_within_the_alb_delay(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        drain = hook(t, "TERMINATING")
        # the drain deadline and the ALB's own drain: the deregistration delay is the longer one, a backstop
        assert p.fleet.load_balancer.deregistration_delay_s >= p.fleet.drain.deadline_s
        ud = user_data(t)
        assert f"--drain-hook {drain['LifecycleHookName']}" in ud
        assert f"--drain-deadline {p.fleet.drain.deadline_s}" in ud

    def test_the_monitoring_is_named_for_the_stack_and_follows_the_profiles_hardware(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        alarms = [r["Properties"] for r in resources(t, "AWS::CloudWatch::Alarm").values()]
        assert f"{stack}: no instance passes /health" in [a.get("AlarmDescription") for a in alarms]
        body = json.dumps(only(t, "AWS::CloudWatch::Dashboard")["DashboardBody"])
        assert ("DraftAcceptanceRate" in body) == p.mtp
        assert ("nvidia_smi_utilization_gpu" in body) == p.hardware.has_gpu


def test_the_committed_defaults_are_on_demand_and_always_on(templates):
    for t in templates.values():
        props = only(t, "AWS::AutoScaling::AutoScalingGroup")
        assert "MixedInstancesPolicy" not in props and "CapacityRebalance" not in props
        assert not resources(t, "AWS::AutoScaling::ScheduledAction")


def test_instance_role_reads_only_its_secret_and_the_cache_prefix(templates):
    t = templates["GravitonMoeStack"]
    res = t.to_json()["Resources"]
    role = next(k for k in res if k.startswith("FleetInstanceRole") and res[k]["Type"] == "AWS::IAM::Role")
    policy = next(
        v["Properties"]["PolicyDocument"]["Statement"]
        for v in res.values()
        if v["Type"] == "AWS::IAM::Policy" and v["Properties"]["Roles"] == [{"Ref": role}]
    )
    secret = next(k for k, v in res.items() if v["Type"] == "AWS::SecretsManager::Secret")
    bucket = next(k for k in res if k.startswith("ModelCacheBucket") and res[k]["Type"] == "AWS::S3::Bucket")
    granted = {a for st in policy for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])}
    assert {"secretsmanager:GetSecretValue", "s3:GetObject", "s3:PutObject"} <= granted
    for statement in policy:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if any(a.startswith("secretsmanager:") for a in actions):
            assert statement["Resource"] == {"Ref": secret}
        if any(a.startswith("s3:") for a in actions):
            text = json.dumps(statement["Resource"])
            assert bucket in text
            if "s3:GetObject" in actions:
                assert text.endswith('"/models/*"]]}'), text
            assert not any(a.endswith("*") or a.startswith("s3:Delete") for a in actions), actions
        assert "*" not in actions
