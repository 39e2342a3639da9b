"""The SageMaker constructs, each alone in a bare stack: their props refused with what to change, their resources."""

from __future__ import annotations

import json
from dataclasses import replace

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ecr as ecr
from aws_cdk.assertions import Match, Template

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.container.names import RUNTIME_SPEC_ENV
from stacks.errors import PropsError
from stacks.sagemaker.endpoint import SageMakerEndpoint
from stacks.sagemaker.monitoring import EndpointMonitoring
from stacks.sagemaker.network import EndpointNetwork
from stacks.sagemaker.scaling import EndpointScaling
from stacks.sagemaker.staging import ModelStaging
from tests.stacks.sagemaker.conftest import on_sagemaker


def test_the_network_has_no_way_out_but_the_vpc_endpoints(stack):
    net = EndpointNetwork(stack, "Network", cidr="10.50.0.0/16", max_azs=2)
    t = Template.from_stack(stack)
    t.resource_count_is("AWS::EC2::NatGateway", 0)
    t.resource_count_is("AWS::EC2::InternetGateway", 0)
    t.resource_count_is("AWS::EC2::Subnet", 2)
    t.has_resource_properties("AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway"})
    assert len(t.find_resources("AWS::EC2::VPCEndpoint", {"Properties": {"VpcEndpointType": "Interface"}})) == 2
    (sg,) = [
        r for r in t.find_resources("AWS::EC2::SecurityGroup").values()
        if "SageMaker endpoint" in r["Properties"]["GroupDescription"]
    ]  # fmt: skip
    assert "SecurityGroupIngress" not in sg["Properties"]
    assert {e["FromPort"] for e in sg["Properties"]["SecurityGroupEgress"]} == {443}
    assert len(net.subnets) == 2


@pytest.mark.parametrize(
    ("cidr", "zones", "match"), [("10.0.0.0/8", 2, "use a /16 to /24"), ("10.0.0.0/16", 7, "max_azs 7 must be 1-6")]
)
def test_the_network_refuses_bad_props(stack, cidr, zones, match):
    with pytest.raises(PropsError, match=match):
        EndpointNetwork(stack, "Network", cidr=cidr, max_azs=zones)


def test_staging_runs_the_fetcher_into_the_pins_own_prefix(stack, bucket, assets):
    profile, _, plan = on_sagemaker("GravitonMoeStack")
    runtime = profile.runtime()
    staging = ModelStaging(stack, "Staging", runtime=runtime, bucket=bucket, context=assets[0], sources=assets[1],
                           timeout_s=plan.staging_s)  # fmt: skip
    t = Template.from_stack(stack)
    (project,) = t.find_resources("AWS::CodeBuild::Project").values()
    env = {v["Name"]: v["Value"] for v in project["Properties"]["Environment"]["EnvironmentVariables"]}
    assert json.loads(env["RUNTIME_SPEC"]) == json.loads(runtime.to_json())
    assert staging.key_prefix == f"sagemaker/{runtime.model.sha256}"
    assert staging.key.endswith(f"/{runtime.model.repo}/{runtime.model.revision}/{runtime.model.file}")
    buildspec = project["Properties"]["Source"]["BuildSpec"]
    assert "gguf_serve.container.launch fetch" in buildspec and "sha256sum -c" in buildspec
    assert project["Properties"]["TimeoutInMinutes"] >= plan.staging_s / 60
    t.has_resource_properties(
        "AWS::CloudFormation::CustomResource",
        {"Key": staging.key, "Sha256": runtime.model.sha256, "SizeBytes": str(runtime.model.size_bytes)},
    )
    listing = [
        s for policy in t.find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Action"] == "s3:ListBucket"
    ]  # fmt: skip
    assert [s["Condition"] for s in listing] == [{"StringEquals": {"s3:prefix": [staging.key]}}]  # HeadObject: 404


def test_staging_refuses_an_unpinned_model_and_a_wait_past_cloudformations(stack, bucket, assets):
    profile, _, plan = on_sagemaker("GravitonMoeStack")
    runtime = profile.runtime()
    unpinned = replace(runtime, model=replace(runtime.model, sha256=None))
    with pytest.raises(ProfileError, match="has no pinned sha256; lock it before a SageMaker deploy"):
        ModelStaging(stack, "A", runtime=unpinned, bucket=bucket, context=assets[0], sources=assets[1], timeout_s=60)
    with pytest.raises(PropsError, match="timeout_s 3600 must be 1 to 3599"):
        ModelStaging(stack, "B", runtime=runtime, bucket=bucket, context=assets[0], sources=assets[1], timeout_s=3600)


def _endpoint(stack, bucket, stack_name: str, **changes) -> tuple[SageMakerEndpoint, object, object]:
    profile, _, plan = on_sagemaker(stack_name)
    net = EndpointNetwork(stack, "Network", cidr="10.50.0.0/16", max_azs=2)
    props = dict(
        endpoint_name="gguf-serve-test", runtime=profile.runtime(), plan=plan, image_uri="example/image:tag",
        repository=ecr.Repository(stack, "Repo"), bucket=bucket, model_prefix_uri="s3://b/sagemaker/x/",
        model_key_prefix="sagemaker/x", subnets=net.subnets, security_group=net.security_group,
    )  # fmt: skip
    return SageMakerEndpoint(stack, "Serving", **{**props, **changes}), profile, plan


def test_the_model_is_isolated_and_reads_the_staged_prefix_uncompressed(stack, bucket):
    endpoint, profile, plan = _endpoint(stack, bucket, "GravitonMoeStack")
    t = Template.from_stack(stack)
    (model,) = t.find_resources("AWS::SageMaker::Model").values()
    p = model["Properties"]
    assert p["EnableNetworkIsolation"] is True and len(p["VpcConfig"]["Subnets"]) == 2
    container = p["PrimaryContainer"]
    assert json.loads(container["Environment"][RUNTIME_SPEC_ENV]) == json.loads(profile.runtime().to_json())
    assert container["Environment"]["GGUF_SERVE_ENDPOINT_NAME"] == "gguf-serve-test"
    assert container["ModelDataSource"]["S3DataSource"] == {
        "S3Uri": "s3://b/sagemaker/x/", "S3DataType": "S3Prefix", "CompressionType": "None"
    }  # fmt: skip
    (config,) = t.find_resources("AWS::SageMaker::EndpointConfig").values()
    (variant,) = config["Properties"]["ProductionVariants"]
    assert variant["InstanceType"] == "ml.c8g.4xlarge" and variant["VolumeSizeInGB"] == plan.volume_gb
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == plan.startup_timeout_s
    assert variant["ModelDataDownloadTimeoutInSeconds"] == plan.download_timeout_s
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert "InferenceAmiVersion" not in variant and "KmsKeyId" in config["Properties"]
    t.has_resource_properties("AWS::SageMaker::Endpoint", {"EndpointName": "gguf-serve-test"})
    t.has_resource_properties(
        "AWS::Logs::LogGroup", {"LogGroupName": "/aws/sagemaker/Endpoints/gguf-serve-test", "RetentionInDays": 30}
    )
    reads = [
        s for policy in t.find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"] if "s3:GetObject" in json.dumps(s["Action"])
    ]  # fmt: skip
    assert reads and all("sagemaker/x/*" in json.dumps(s["Resource"]) for s in reads)


def test_a_gpu_variant_takes_its_driver_ami_and_no_kms_key_on_instance_storage(stack, bucket):
    _endpoint(stack, bucket, "GpuMtpStack")
    (config,) = Template.from_stack(stack).find_resources("AWS::SageMaker::EndpointConfig").values()
    (variant,) = config["Properties"]["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g5.xlarge"
    assert variant["InferenceAmiVersion"] == "al2-ami-sagemaker-inference-gpu-3-1"
    assert "VolumeSizeInGB" not in variant and "KmsKeyId" not in config["Properties"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"endpoint_name": "x" * 64}, "1-63 letters, digits and hyphens"),
        ({"endpoint_name": "bad_name"}, "1-63 letters, digits and hyphens"),
        ({"subnets": []}, "no subnets"),
    ],
)
def test_the_endpoint_refuses_bad_props(stack, bucket, changes, match):
    with pytest.raises(PropsError, match=match):
        _endpoint(stack, bucket, "GravitonMoeStack", **changes)


def test_a_runtime_spec_over_an_environment_value_is_refused(stack, bucket):
    profile, _, _ = on_sagemaker("GravitonMoeStack")
    runtime = profile.runtime()
    long = replace(runtime, name="p" * 600)
    with pytest.raises(PropsError, match=r"runtime spec is \d+ characters; a model's Environment value takes at"):
        _endpoint(stack, bucket, "GravitonMoeStack", runtime=long)


def test_scaling_tracks_concurrent_requests_per_model_against_the_slots(stack):
    _, _, plan = on_sagemaker("GravitonMoeStack")
    endpoint = cdk.CfnWaitConditionHandle(stack, "Endpoint")  # stands for the CfnEndpoint the target waits for
    EndpointScaling(stack, "Scaling", endpoint_name="gguf-serve-test", variant_name="AllTraffic", endpoint=endpoint,
                    min_instances=1, max_instances=4, target_concurrency=plan.target_concurrency)  # fmt: skip
    t = Template.from_stack(stack)
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {"ResourceId": "endpoint/gguf-serve-test/variant/AllTraffic", "ServiceNamespace": "sagemaker",
         "ScalableDimension": "sagemaker:variant:DesiredInstanceCount", "MinCapacity": 1, "MaxCapacity": 4},
    )  # fmt: skip
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {"TargetTrackingScalingPolicyConfiguration": Match.object_like({
            "TargetValue": 1.4, "ScaleInCooldown": 900,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"},
        })},
    )  # fmt: skip
    assert plan.target_concurrency == 1.4  # 2 slots x 0.7
    (target,) = t.find_resources("AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert target["DependsOn"] == [stack.get_logical_id(endpoint)]  # registered once the endpoint exists


@pytest.mark.parametrize(
    ("bounds", "target", "match"), [((0, 2), 1.0, "need 1 <= min 0"), ((3, 2), 1.0, "<= max 2"), ((1, 2), 0, "above 0")]
)
def test_scaling_refuses_bad_props(stack, bounds, target, match):
    with pytest.raises(PropsError, match=match):
        EndpointScaling(stack, "S", endpoint_name="e", variant_name="v", endpoint=cdk.CfnWaitConditionHandle(
            stack, "E"), min_instances=bounds[0], max_instances=bounds[1], target_concurrency=target)  # fmt: skip


def test_monitoring_watches_sagemakers_and_the_containers_metrics_by_endpoint_and_variant(stack):
    EndpointMonitoring(stack, "Monitoring", name="GravitonMoeSageMakerStack", endpoint_name="gguf-serve-test",
                       variant_name="AllTraffic", deferred_alarm=4, has_gpu=False, mtp=False)  # fmt: skip
    t = Template.from_stack(stack)
    alarms = t.find_resources("AWS::CloudWatch::Alarm")
    by_metric = {a["Properties"].get("MetricName"): a["Properties"] for a in alarms.values()}
    dims = [{"Name": "EndpointName", "Value": "gguf-serve-test"}, {"Name": "VariantName", "Value": "AllTraffic"}]
    for metric in ("RequestsDeferred", "DrainStreamsCut", "TimeToFirstToken", "ScrapeFailed"):
        assert by_metric[metric]["Namespace"] == "GgufServe/LlamaServer" and by_metric[metric]["Dimensions"] == dims
    assert by_metric["RequestsDeferred"]["Threshold"] == 4
    assert by_metric["ScrapeFailed"]["TreatMissingData"] == "breaching"  # silence is the failure
    rate = next(a["Properties"] for a in alarms.values() if "Metrics" in a["Properties"])
    assert "Invocation5XXErrors" in json.dumps(rate["Metrics"])
    t.has_resource_properties("AWS::CloudWatch::Dashboard", {"DashboardName": "GravitonMoeSageMakerStack-llama"})
    with pytest.raises(ValueError, match="deferred_alarm at least 1"):
        EndpointMonitoring(stack, "M2", name="x", endpoint_name="e", variant_name="v", deferred_alarm=0,
                           has_gpu=False, mtp=False)  # fmt: skip
