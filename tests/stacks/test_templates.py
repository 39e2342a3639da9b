"""Fine-grained assertions on each synthesized stack."""

from __future__ import annotations

import base64
import json
import re

import pytest
from aws_cdk.assertions import Match, Template

from catalog import ProfileError
from stacks.app import build_app
from tests.committed import PROFILES, profile_by_stack
from tests.conftest import cdk_context
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
    m = re.search(r'echo "([A-Za-z0-9+/=]+)" \| base64 -d > "/etc/gguf-serve/runtime.json"', user_data(template))
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

    def test_imdsv2_ssm_no_ssh_encrypted_gp3(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        data = only(t, "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert "KeyName" not in data
        (volume,) = data["BlockDeviceMappings"]
        ebs = volume["Ebs"]
        assert ebs["Encrypted"] is True and ebs["VolumeType"] == "gp3"
        assert ebs["VolumeSize"] >= p.model.size_bytes / 1024**3 + 10
        assert ebs["Throughput"] == p.fleet.volume_throughput_mibps
        t.has_resource_properties(
            "AWS::IAM::Role",
            {
                "AssumeRolePolicyDocument": Match.object_like(
                    {"Statement": [Match.object_like({"Principal": {"Service": "ec2.amazonaws.com"}})]}
                ),
                "ManagedPolicyArns": [Match.object_like({"Fn::Join": Match.any_value()})],
            },
        )

    def test_internal_alb_health_check_and_timeouts(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        alb = only(t, "AWS::ElasticLoadBalancingV2::LoadBalancer")
        assert alb["Scheme"] == "internal"
        attrs = {a["Key"]: a["Value"] for a in alb["LoadBalancerAttributes"]}
        assert int(attrs["idle_timeout.timeout_seconds"]) > 2048 / 4.56  # the report's slowest generation
        assert attrs["access_logs.s3.enabled"] == "true"
        tg = only(t, "AWS::ElasticLoadBalancingV2::TargetGroup")
        assert tg["HealthCheckPath"] == "/health"
        assert tg["Matcher"] == {"HttpCode": "200"}
        assert tg["Port"] == p.server.port
        tg_attrs = {a["Key"]: a["Value"] for a in tg["TargetGroupAttributes"]}
        assert int(tg_attrs["deregistration_delay.timeout_seconds"]) >= 450

    def test_group_waits_for_model_download(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        (asg,) = resources(t, "AWS::AutoScaling::AutoScalingGroup").values()
        props = asg["Properties"]
        assert props["HealthCheckType"] == "ELB"
        download_s = p.model.size_bytes / (15 * 1024 * 1024)  # one ModelScope stream
        assert props["HealthCheckGracePeriod"] >= download_s
        assert asg["CreationPolicy"]["ResourceSignal"]["Count"] == p.fleet.min_capacity
        rolling = asg["UpdatePolicy"]["AutoScalingRollingUpdate"]
        assert rolling["WaitOnResourceSignals"] is True and rolling["MaxBatchSize"] == 1
        assert "LaunchTemplate" in props and "LaunchConfigurationName" not in props

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


def test_stacks_named_as_users_type_them(app):
    assert sorted(s.node.id for s in app.node.children if hasattr(s, "stack_name")) == sorted(
        ["GravitonMoeStack", "IntelMoeStack", "GpuMtpStack", "GravitonMoeHeadroomStack"]
    )
    assert {p.stack_name for p in PROFILES.values()} == set(STACK_NAMES)


@pytest.mark.parametrize("stack", STACK_NAMES)
class TestOperatingAtScale:
    def test_scales_on_llama_cpp_signals_not_cpu(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        policies = [r["Properties"] for r in resources(t, "AWS::AutoScaling::ScalingPolicy").values()]
        tracking = [x for x in policies if x["PolicyType"] == "TargetTrackingScaling"]
        assert len(tracking) == 1
        spec = tracking[0]["TargetTrackingConfiguration"]
        assert spec["CustomizedMetricSpecification"]["MetricName"] == "SlotsBusyRatio"
        assert spec["CustomizedMetricSpecification"]["Namespace"] == "GgufServe/LlamaServer"
        assert spec["TargetValue"] == p.fleet.target_busy_slot_ratio * 100
        step = [x for x in policies if x["PolicyType"] == "StepScaling"]
        assert step and all(x["AdjustmentType"] == "ChangeInCapacity" for x in step)
        alarms = [r["Properties"] for r in resources(t, "AWS::CloudWatch::Alarm").values()]
        step_alarm_metrics = {a.get("MetricName") for a in alarms if "DeferredRequests" in json.dumps(a)}
        assert "RequestsDeferred" in step_alarm_metrics
        shed = [a for a in alarms if a.get("MetricName") == "RequestsShed"]  # the hop's 429s add capacity
        assert shed and shed[0]["Statistic"] == "Sum" and shed[0]["AlarmActions"]
        assert not any(a.get("MetricName") == "CPUUtilization" for a in alarms)

    def test_warm_pool_and_ready_hook(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        pool = only(t, "AWS::AutoScaling::WarmPool")
        assert pool["PoolState"] == "Stopped" and pool["MinSize"] == p.fleet.warm_pool_size
        ready = hook(t, "LAUNCHING")
        assert ready["DefaultResult"] == "ABANDON" and ready["HeartbeatTimeout"] >= p.boot_budget_s
        assert f'--lifecycle-hook-name "{ready["LifecycleHookName"]}"' in user_data(t)

    def test_the_hooks_are_part_of_the_group_so_no_instance_launches_without_them(self, templates, stack):
        """No first, warm or scale-out instance launches without the launch hook holding it until the ready unit
        completes it: the hooks are created with the group, not as resources created after it."""
        t = templates[stack]
        assert not resources(t, "AWS::AutoScaling::LifecycleHook")
        hooks = only(t, "AWS::AutoScaling::AutoScalingGroup")["LifecycleHookSpecificationList"]
        assert sorted(h["LifecycleTransition"] for h in hooks) == [
            "autoscaling:EC2_INSTANCE_LAUNCHING", "autoscaling:EC2_INSTANCE_TERMINATING"
        ]  # fmt: skip

    def test_drain_hook_continues_and_its_heartbeats_are_granted_on_the_group_only(self, templates, stack):
        from runtime.names import DRAIN_HEARTBEAT_S, DRAIN_HOOK

        t, p = templates[stack], profile_by_stack(stack)
        drain = hook(t, "TERMINATING")
        assert drain["LifecycleHookName"] == DRAIN_HOOK and drain["DefaultResult"] == "CONTINUE"
        assert DRAIN_HEARTBEAT_S < drain["HeartbeatTimeout"] <= 4 * DRAIN_HEARTBEAT_S
        # the drain deadline and the ALB's own drain: the deregistration delay is the longer one, a backstop
        assert p.fleet.deregistration_delay_s >= p.fleet.drain_deadline_s
        ud = user_data(t)
        assert f"--drain-hook {DRAIN_HOOK}" in ud and f"--drain-deadline {p.fleet.drain_deadline_s}" in ud
        statements = [
            s for r in resources(t, "AWS::IAM::Policy").values() for s in r["Properties"]["PolicyDocument"]["Statement"]
        ]
        lifecycle = [s for s in statements if "autoscaling:RecordLifecycleActionHeartbeat" in json.dumps(s["Action"])]
        assert len(lifecycle) == 1 and "autoScalingGroupName/" in json.dumps(lifecycle[0]["Resource"])

    def test_alarms_and_dashboard(self, templates, stack):
        t, p = templates[stack], profile_by_stack(stack)
        alarms = [r["Properties"] for r in resources(t, "AWS::CloudWatch::Alarm").values()]
        described = " ".join(a.get("AlarmDescription", "") for a in alarms)
        for what in ("no instance passes /health", "5xx", "requests queue"):
            assert what in described
        body = json.dumps(only(t, "AWS::CloudWatch::Dashboard")["DashboardBody"])
        for metric in ("GeneratedTokensPerSecond", "RequestsDeferred", "TargetResponseTime", "HealthyHostCount"):
            assert metric in body
        assert ("DraftAcceptanceRate" in body) == p.mtp
        assert ("nvidia_smi_utilization_gpu" in body) == p.hardware.has_gpu


class TestOptionsOffByDefault:
    def test_defaults_are_on_demand_and_always_on(self, templates):
        for t in templates.values():
            props = only(t, "AWS::AutoScaling::AutoScalingGroup")
            assert "MixedInstancesPolicy" not in props and "CapacityRebalance" not in props
            assert not resources(t, "AWS::AutoScaling::ScheduledAction")

    def test_spot_with_rebalancing_on_cpu_stacks_only(self):
        app = build_app({**cdk_context(), "spot": "true"})
        for name in STACK_NAMES:
            props = only(Template.from_stack(app.node.find_child(name)), "AWS::AutoScaling::AutoScalingGroup")
            if profile_by_stack(name).hardware.has_gpu:
                assert "MixedInstancesPolicy" not in props
            else:
                dist = props["MixedInstancesPolicy"]["InstancesDistribution"]
                assert dist["OnDemandPercentageAboveBaseCapacity"] == 0
                assert dist["SpotAllocationStrategy"] == "capacity-optimized"
                assert props["CapacityRebalance"] is True

    def test_off_hours_schedule_scales_to_zero(self):
        app = build_app({**cdk_context(), "offHours": "20-8"})
        actions = resources(
            Template.from_stack(app.node.find_child("GravitonMoeStack")), "AWS::AutoScaling::ScheduledAction"
        )
        by_hour = {a["Properties"]["Recurrence"]: a["Properties"] for a in actions.values()}
        assert (
            by_hour["0 20 * * MON-FRI"]["MaxSize"] == 0 and by_hour["0 20 * * MON-FRI"]["TimeZone"] == "Asia/Shanghai"
        )
        assert by_hour["0 8 * * MON-FRI"]["MinSize"] == PROFILES["graviton-moe"].fleet.min_capacity

    def test_bad_off_hours_says_how_to_write_it(self):
        with pytest.raises(ProfileError, match="offHours=20-8"):
            build_app({**cdk_context(), "offHours": "evenings"})

    def test_allowed_cidrs_replace_the_vpc_default(self):
        app = build_app({**cdk_context(), "allowedCidrs": "10.8.0.0/16, 192.168.10.0/24"})
        t = Template.from_stack(app.node.find_child("IntelMoeStack"))
        sgs = [
            r["Properties"] for k, r in resources(t, "AWS::EC2::SecurityGroup").items() if k.startswith("LoadBalancer")
        ]
        assert {r["CidrIp"] for r in sgs[0]["SecurityGroupIngress"]} == {"10.8.0.0/16", "192.168.10.0/24"}


def test_image_build_args_reach_codebuild_and_change_the_tag(templates):
    mirror = "PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple"
    app = build_app({**cdk_context(), "imageBuildArgs": mirror})
    t = Template.from_stack(app.node.find_child("GravitonMoeStack"))
    env = {e["Name"]: e["Value"] for e in only(t, "AWS::CodeBuild::Project")["Environment"]["EnvironmentVariables"]}
    default_env = {
        e["Name"]: e["Value"]
        for e in only(templates["GravitonMoeStack"], "AWS::CodeBuild::Project")["Environment"]["EnvironmentVariables"]
    }
    assert env["BUILD_ARGS"] == mirror and default_env["BUILD_ARGS"] == ""
    assert env["IMAGE_TAG"] != default_env["IMAGE_TAG"] and env["IMAGE_TAG"].startswith("arm64-cpu-")
    with pytest.raises(ProfileError, match="NAME=value"):
        build_app({**cdk_context(), "imageBuildArgs": "oops"})


class TestHardening:
    def test_instance_role_reads_only_its_secret_and_the_cache_prefix(self, templates):
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

    def test_https_listener_when_a_certificate_is_given(self):
        arn = "arn:aws-cn:acm:cn-northwest-1:111122223333:certificate/0a1b2c3d-1111-2222-3333-444455556666"
        app = build_app({**cdk_context(), "certificateArn": arn})
        t = Template.from_stack(app.node.find_child("GpuMtpStack"))
        listener = only(t, "AWS::ElasticLoadBalancingV2::Listener")
        assert listener["Protocol"] == "HTTPS" and listener["Port"] == 443
        assert listener["Certificates"] == [{"CertificateArn": arn}]
        assert "https://" in json.dumps(t.to_json()["Outputs"]["EndpointUrl"])

    def test_flow_logs_and_access_logs_are_on(self, templates):
        for t in templates.values():
            assert only(t, "AWS::EC2::FlowLog")["TrafficType"] == "ALL"
            cache = [
                r["Properties"] for k, r in resources(t, "AWS::S3::Bucket").items() if k.startswith("ModelCacheBucket")
            ]
            assert cache[0]["LoggingConfiguration"]["LogFilePrefix"] == "model-cache/"
