"""Each SageMaker stack created in moto's CloudFormation (cn-northwest-1), and what it wires together there.

What moto 5.2.5 does not model, and how this test bridges it (each a gap of moto, not of the template):
- Custom resources (the image build, the model staging), CodeBuild and the dashboard are not run: they are removed
  with what references only them (the model's DependsOn on them goes too). Their handlers are tested alone.
- Application Auto Scaling and CloudWatch alarms have no CloudFormation support: they are replayed through the
  real API calls with the template's own properties.
- moto's endpoint-configuration instance types (a fixed list from 2020) include no ml.c8g, ml.c7i or ml.g5 type:
  the variant's type is swapped for one it knows, after checking that moto refuses the real one.
- moto names an endpoint after its logical id, not its EndpointName: the test reads the name moto gave it; and its
  model drops EnableNetworkIsolation (the template's value is checked instead).
- moto runs no container: nothing here shows the endpoint serving (the image tier's rehearsal does that).
The CDK bootstrap (asset buckets) is stood in as tests/stacks/test_moto_deploy.py does.
"""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from gguf_serve.container.names import RUNTIME_SPEC_ENV
from tests.stacks.test_moto_deploy import ACCOUNT, REGION, _refs, bootstrap, resolve

NOT_IN_MOTO = {"AWS::CloudFormation::CustomResource", "AWS::CodeBuild::Project", "AWS::CloudWatch::Dashboard"}
REPLAYED = {
    "AWS::ApplicationAutoScaling::ScalableTarget",
    "AWS::ApplicationAutoScaling::ScalingPolicy",
    "AWS::CloudWatch::Alarm",
}
MOTO_KNOWS = "ml.c5.4xlarge"


def prepare(template: dict) -> tuple[dict, dict, list[str]]:
    res = template["Resources"]
    dropped = {k for k, v in res.items() if v["Type"].startswith("Custom::") or v["Type"] in NOT_IN_MOTO}
    grew = True
    while grew:
        grew = False
        for k, v in res.items():
            if k not in dropped and v["Type"] not in REPLAYED and _refs(v, dropped):
                dropped.add(k)
                grew = True
    replay = {k: v for k, v in res.items() if v["Type"] in REPLAYED}
    for k in dropped | set(replay):
        del res[k]
    for v in res.values():
        if "DependsOn" in v:
            deps = [v["DependsOn"]] if isinstance(v["DependsOn"], str) else v["DependsOn"]
            v["DependsOn"] = [d for d in deps if d in res]
        if v["Type"] == "AWS::ECR::Repository":
            v["Properties"].setdefault("RepositoryName", "serving")
    template.pop("Rules", None)
    return template, replay, sorted(dropped)


@pytest.mark.parametrize("stack", ["GravitonMoeSageMakerStack", "GpuMtpSageMakerStack"])
def test_the_sagemaker_stack_creates_and_wires_together_in_moto(assembly, stack):
    template, replayed, dropped = prepare(json.loads(json.dumps(assembly.get_stack_by_name(stack).template)))
    assert all(d.startswith(("Image", "Staging", "NetworkVpcRestrict", "MonitoringDashboard")) for d in dropped), (
        dropped
    )
    config_id, config = next(
        (k, v) for k, v in template["Resources"].items() if v["Type"] == "AWS::SageMaker::EndpointConfig"
    )
    (variant,) = config["Properties"]["ProductionVariants"]
    real_type = variant["InstanceType"]
    with mock_aws():
        bootstrap(template)
        sagemaker = boto3.client("sagemaker", region_name=REGION)
        with pytest.raises(sagemaker.exceptions.ClientError, match="instanceType"):
            sagemaker.create_endpoint_config(
                EndpointConfigName="probe",
                ProductionVariants=[{"VariantName": "v", "ModelName": "m", "InstanceType": real_type,
                                     "InitialInstanceCount": 1}],
            )  # fmt: skip
        variant["InstanceType"] = MOTO_KNOWS
        cf = boto3.client("cloudformation", region_name=REGION)
        cf.create_stack(StackName=stack, TemplateBody=json.dumps(template), Capabilities=["CAPABILITY_IAM"])
        assert cf.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
        physical = {
            r["LogicalResourceId"]: r["PhysicalResourceId"]
            for r in cf.list_stack_resources(StackName=stack)["StackResourceSummaries"]
        }
        (endpoint,) = sagemaker.list_endpoints()["Endpoints"]
        described = sagemaker.describe_endpoint(EndpointName=endpoint["EndpointName"])
        config_name = described["EndpointConfigName"]
        config_out = sagemaker.describe_endpoint_config(EndpointConfigName=config_name)
        (variant_out,) = config_out["ProductionVariants"]
        model = sagemaker.describe_model(ModelName=variant_out["ModelName"])
        # moto's CloudFormation model drops EnableNetworkIsolation (it reads role, container and VpcConfig only)
        assert model["EnableNetworkIsolation"] is False
        model_props = next(v for v in template["Resources"].values() if v["Type"] == "AWS::SageMaker::Model")
        assert model_props["Properties"]["EnableNetworkIsolation"] is True
        assert model["PrimaryContainer"]["Environment"][RUNTIME_SPEC_ENV].startswith('{"model": ')
        assert model["ExecutionRoleArn"].startswith(f"arn:aws-cn:iam::{ACCOUNT}:role/")
        subnets = set(model["VpcConfig"]["Subnets"])
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc_subnets = ec2.describe_subnets(SubnetIds=list(subnets))["Subnets"]
        assert len(vpc_subnets) == 2 and len({s["AvailabilityZone"] for s in vpc_subnets}) == 2
        routes = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": list(subnets)}])
        targets = {r.get("GatewayId", "") for t in routes["RouteTables"] for r in t["Routes"]}
        assert not any(g.startswith("igw-") for g in targets)  # isolated: no internet gateway route
        assert not any(r.get("NatGatewayId") for t in routes["RouteTables"] for r in t["Routes"])

        # Application Auto Scaling and the alarms, replayed with the template's own properties
        physical.update({"AWS::AccountId": ACCOUNT, "AWS::Partition": "aws-cn", "AWS::Region": REGION})
        scaling = boto3.client("application-autoscaling", region_name=REGION)
        cloudwatch = boto3.client("cloudwatch", region_name=REGION)
        for name, r in replayed.items():
            if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy":
                continue  # once its target is registered (below)
            p = resolve(r["Properties"], physical)
            if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget":
                assert p["RoleARN"] == (
                    f"arn:aws-cn:iam::{ACCOUNT}:role/aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
                    "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
                )
                scaling.register_scalable_target(**{k: v for k, v in p.items() if k != "RoleARN"})
            elif r["Type"] == "AWS::CloudWatch::Alarm":
                cloudwatch.put_metric_alarm(**{"AlarmName": name, **p})
        for r in replayed.values():
            if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy":
                p = resolve({k: v for k, v in r["Properties"].items() if k != "ScalingTargetId"}, physical)
                target = next(v for v in replayed.values() if v["Type"].endswith("ScalableTarget"))["Properties"]
                scaling.put_scaling_policy(**{**p, **{k: target[k] for k in ("ServiceNamespace", "ResourceId",
                                                                               "ScalableDimension")}})  # fmt: skip
        (policy,) = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
        tracking = policy["TargetTrackingScalingPolicyConfiguration"]
        assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == (
            "SageMakerVariantConcurrentRequestsPerModelHighResolution"
        )
        assert policy["ResourceId"].endswith("/variant/AllTraffic")
        alarms = cloudwatch.describe_alarms()["MetricAlarms"]
        assert {a.get("MetricName") for a in alarms} >= {"RequestsDeferred", "DrainStreamsCut", "ScrapeFailed"}
