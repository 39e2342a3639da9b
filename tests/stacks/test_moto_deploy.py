"""Create each synthesized stack in moto (cn-northwest-1) and check that the parts wire together.

What moto does not model, and how this test bridges it (each is a gap of moto, not of the template):
- The CDK bootstrap (SSM version parameter, asset bucket): the version is passed as a value and the asset
  bucket is created with a stub zip at every asset key the template names.
- Public SSM AMI parameters (`/aws/...` names cannot be written): a moto AMI id is passed instead.
- Custom resources (the image build trigger, CDK's default-SG restriction) and CodeBuild are not run; they are
  removed with what references only them. The image build is exercised by its own handler tests.
- CloudFormation support is missing for alarms, scaling policies, the warm pool, the lifecycle hook, security
  group egress and the dashboard; the scaling/alarm resources are replayed through the real API calls with the
  template's own properties, so their metric names, dimensions and actions are checked against real resources.
- An ECR repository needs a name in moto; a Secrets Manager secret's Ref resolves to nothing in a policy.
Nothing here checks that instances boot: moto launches no operating system.
"""

from __future__ import annotations

import io
import json
import re
import zipfile

import boto3
import pytest
from moto import mock_aws

from gguf_serve.container.names import DRAIN_HOOK
from gguf_serve.container.names import LIFECYCLE_HOOK as READY_HOOK
from tests.committed import profile_by_stack
from tests.stacks.conftest import STACK_NAMES

REGION = "cn-northwest-1"
ACCOUNT = "123456789012"
NOT_IN_MOTO = {"AWS::CloudFormation::CustomResource", "AWS::CodeBuild::Project", "AWS::CloudWatch::Dashboard"}
REPLAYED = {"AWS::AutoScaling::ScalingPolicy", "AWS::CloudWatch::Alarm", "AWS::AutoScaling::WarmPool"}


def _refs(resource: dict, names) -> set[str]:
    text = json.dumps(resource.get("Properties", {}))
    return {n for n in names if f'"Ref": "{n}"' in text or f'["{n}", ' in text}


def prepare(template: dict) -> tuple[dict, dict, list[str]]:
    """Template moto can create, plus the resources to replay through the API."""
    res = template["Resources"]
    text = json.dumps(template)
    for secret in (k for k, v in res.items() if v["Type"] == "AWS::SecretsManager::Secret"):  # a shared key: none
        text = text.replace(
            json.dumps({"Ref": secret}),
            json.dumps({"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:key"}),
        )
    text = re.sub(r'\{"Fn::GetAtt": \["\w+", "TargetGroupFullName"\]\}', '"targetgroup/serving/0123456789abcdef"', text)
    template = json.loads(text)
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


def bootstrap(template: dict) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    for name, p in template["Parameters"].items():
        if "Image::Id" in p["Type"]:
            template["Parameters"][name] = {"Type": "String", "Default": ami}
        elif p["Type"].startswith("AWS::SSM"):
            template["Parameters"][name] = {"Type": "String", "Default": "30"}
    s3 = boto3.client("s3", region_name=REGION)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("index.py", "def handler(event, context):\n    return {}\n")
    for r in template["Resources"].values():
        code = r.get("Properties", {}).get("Code", {})
        if "S3Bucket" in code:
            bucket = code["S3Bucket"]["Fn::Sub"].replace("${AWS::AccountId}", ACCOUNT).replace("${AWS::Region}", REGION)
            if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
                s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
            s3.put_object(Bucket=bucket, Key=code["S3Key"], Body=buf.getvalue())


def resolve(value, physical: dict):
    """Evaluate the intrinsics these resources use against the created stack's physical ids (and exports)."""
    if isinstance(value, dict):
        if set(value) == {"Ref"}:
            return physical[value["Ref"]]
        if set(value) == {"Fn::ImportValue"}:  # `physical` holds the exports by name too
            return physical[value["Fn::ImportValue"]]
        if set(value) == {"Fn::Join"}:
            sep, parts = value["Fn::Join"]
            return sep.join(resolve(parts, physical))
        if set(value) == {"Fn::Split"}:
            sep, text = value["Fn::Split"]
            return resolve(text, physical).split(sep)
        if set(value) == {"Fn::Select"}:
            index, items = value["Fn::Select"]
            return resolve(items, physical)[index]
        if set(value) == {"Fn::GetAtt"}:
            name, attribute = value["Fn::GetAtt"]
            assert attribute == "LoadBalancerFullName", attribute
            return physical[name].split(":loadbalancer/")[1]
        return {k: resolve(v, physical) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, physical) for v in value]
    return value


def put_group_hooks(template: dict, physical: dict) -> None:
    """moto 5.2.5 creates a group without its LifecycleHookSpecificationList: put each hook, as CreateAutoScalingGroup
    does before it launches an instance."""
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    for name, r in template["Resources"].items():
        if r["Type"] == "AWS::AutoScaling::AutoScalingGroup":
            for spec in r["Properties"].get("LifecycleHookSpecificationList", []):
                autoscaling.put_lifecycle_hook(AutoScalingGroupName=physical[name], **spec)


def replay(resources: dict, physical: dict) -> None:
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    for kind in ["AWS::AutoScaling::WarmPool", "AWS::AutoScaling::ScalingPolicy", "AWS::CloudWatch::Alarm"]:
        for name, r in resources.items():
            if r["Type"] != kind:
                continue
            p = resolve(r["Properties"], physical)
            if kind == "AWS::AutoScaling::WarmPool":
                autoscaling.put_warm_pool(**p)
            elif kind == "AWS::AutoScaling::ScalingPolicy":
                p.setdefault("PolicyName", name)
                autoscaling.put_scaling_policy(**p)
                # moto 5.2.5 answers <PolicyArn>, which botocore drops; read the ARN back instead.
                (policy,) = autoscaling.describe_policies(
                    AutoScalingGroupName=p["AutoScalingGroupName"], PolicyNames=[p["PolicyName"]]
                )["ScalingPolicies"]
                physical[name] = policy["PolicyARN"]
            else:
                p.setdefault("AlarmName", name)
                cloudwatch.put_metric_alarm(**p)


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_stack_creates_and_wires_together_in_moto(committed, stack):
    profile = profile_by_stack(stack)
    template, replayed, dropped = prepare(committed.template(stack))
    assert all(
        d.startswith(("Image", "NetworkVpcRestrictDefaultSecurityGroup", "MonitoringDashboard")) for d in dropped
    ), dropped
    with mock_aws():
        bootstrap(template)
        cf = boto3.client("cloudformation", region_name=REGION)
        cf.create_stack(StackName=stack, TemplateBody=json.dumps(template), Capabilities=["CAPABILITY_IAM"])
        assert cf.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
        physical = {
            r["LogicalResourceId"]: r["PhysicalResourceId"]
            for r in cf.list_stack_resources(StackName=stack)["StackResourceSummaries"]
        }
        put_group_hooks(template, physical)
        replay(replayed, physical)

        autoscaling = boto3.client("autoscaling", region_name=REGION)
        (group,) = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
        name = group["AutoScalingGroupName"]
        assert name.startswith(f"{stack}-ServingGroup-")  # the pattern the instance role may complete hooks on
        assert len(group["Instances"]) == profile.fleet.capacity.min_capacity
        assert group["HealthCheckType"] == "ELB"

        elbv2 = boto3.client("elbv2", region_name=REGION)
        (tg_arn,) = group["TargetGroupARNs"]
        targets = elbv2.describe_target_health(TargetGroupArn=tg_arn)["TargetHealthDescriptions"]
        assert {t["Target"]["Id"] for t in targets} == {i["InstanceId"] for i in group["Instances"]}
        assert {t["Target"]["Port"] for t in targets} == {profile.server.port}
        (lb,) = elbv2.describe_load_balancers()["LoadBalancers"]
        assert lb["Scheme"] == "internal"

        instance_id = group["Instances"][0]["InstanceId"]
        ec2 = boto3.client("ec2", region_name=REGION)
        (reservation,) = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        assert reservation["Instances"][0]["InstanceType"] == profile.hardware.instance_type

        hooks = autoscaling.describe_lifecycle_hooks(AutoScalingGroupName=name)["LifecycleHooks"]
        assert sorted(h["LifecycleHookName"] for h in hooks) == sorted([DRAIN_HOOK, READY_HOOK])
        pool = autoscaling.describe_warm_pool(AutoScalingGroupName=name)["WarmPoolConfiguration"]
        assert pool["PoolState"] == "Stopped" and pool["MinSize"] == profile.fleet.capacity.warm_pool_size

        policies = {
            p["PolicyARN"]: p for p in autoscaling.describe_policies(AutoScalingGroupName=name)["ScalingPolicies"]
        }
        tracking = [p for p in policies.values() if p["PolicyType"] == "TargetTrackingScaling"]
        metric = tracking[0]["TargetTrackingConfiguration"]["CustomizedMetricSpecification"]
        assert metric["MetricName"] == "SlotsBusyRatio"
        assert metric["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": name}]

        cloudwatch = boto3.client("cloudwatch", region_name=REGION)
        alarms = cloudwatch.describe_alarms()["MetricAlarms"]
        step_alarms = [a for a in alarms if any(arn in policies for arn in a["AlarmActions"])]
        assert step_alarms, "no alarm drives a scaling policy"
        assert {a["MetricName"] for a in step_alarms} == {"RequestsDeferred", "RequestsShed"}
        for alarm in step_alarms:
            assert alarm["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": name}]
            (action,) = alarm["AlarmActions"]
            assert policies[action]["PolicyType"] == "StepScaling"
        backlog = [a for a in alarms if a.get("MetricName") == "RequestsDeferred" and not a["AlarmActions"]]
        assert backlog and backlog[0]["Threshold"] == profile.fleet.alarms.deferred_alarm
        rate = [a for a in alarms if a.get("Metrics")]
        assert rate and "errors / requests" in json.dumps(rate[0]["Metrics"])


def test_the_wake_door_of_a_deployed_stack_wakes_it_and_routes_back(synthesized, monkeypatch):
    """The from-zero template (tests/whole_app.py: minimum 0, no warm pool, a request wakes it) created in moto,
    then the wake door's own code run with the environment moto holds for its function (what the Lambda runtime
    gives it): the names it finds the rule and the group by are the deployed ones, and a request at zero wakes the
    group."""
    import importlib.util

    from stacks.wake_door import HANDLER
    from tests.stacks.test_wake_door_handler import alb_request

    doc = json.loads(synthesized["ningxia-from-zero"]["IntelMoeStack"].read_text())
    template, replayed, _ = prepare(doc)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        bootstrap(template)
        cf = boto3.client("cloudformation", region_name=REGION)
        cf.create_stack(StackName="IntelMoeStack", TemplateBody=json.dumps(template), Capabilities=["CAPABILITY_IAM"])
        (fn,) = [
            f for f in boto3.client("lambda", region_name=REGION).list_functions()["Functions"]
            if "WakeDoor" in f["FunctionName"]
        ]  # fmt: skip
        for key, value in fn["Environment"]["Variables"].items():
            monkeypatch.setenv(key, value)
        spec = importlib.util.spec_from_file_location("wake_door_deployed", HANDLER)
        door = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(door)  # type: ignore[union-attr]

        autoscaling = boto3.client("autoscaling", region_name=REGION)
        (group,) = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
        assert (group["DesiredCapacity"], group["MinSize"]) == (0, 0)
        assert door.handler({"source": "aws.events", "detail-type": "Scheduled Event"}, None)["routed"] == "door"
        rule, door_tg, here = door.the_rule()
        assert here and door_tg.split(":targetgroup/")[1].startswith("IntelMoeStack-WakeD")
        # prepare() names the API key's secret `key` (moto resolves no Ref to a generated secret): it holds the key
        boto3.client("secretsmanager", region_name=REGION).create_secret(Name="key", SecretString="sk-deployed")
        keyless = door.handler(alb_request(door_tg), None)  # the stand-in's key is not the stack's: wakes nothing
        assert keyless["statusCode"] == 401, keyless
        request = alb_request(door_tg)
        request["headers"]["authorization"] = "Bearer sk-deployed"
        answer = door.handler(request, None)
        cold = profile_by_stack("IntelMoeStack").wake_up_s(warm_pool=False)  # a new instance, the S3 cache
        assert answer["statusCode"] == 503 and answer["headers"]["Retry-After"] == str(cold)
        (group,) = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
        assert group["DesiredCapacity"] == 1 and len(group["Instances"]) == 1
        elbv2 = boto3.client("elbv2", region_name=REGION)
        (servers,) = group["TargetGroupARNs"]
        elbv2.register_targets(TargetGroupArn=servers, Targets=[{"Id": group["Instances"][0]["InstanceId"]}])
        routed = door.handler({"source": "aws.autoscaling", "detail-type": "EC2 Instance Launch Successful"}, None)
        assert routed == {"routed": "servers", "in_service": 1}
        assert not door.the_rule()[2]
