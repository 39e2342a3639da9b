"""The wake door's function (stacks/handlers/wake_door.py) against moto's EC2 Auto Scaling and ELBv2: a request to
a group at zero wakes it and is told when to come back; the group's events route requests to the servers and
back; a lost event is put right by the next request."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from stacks.wake_door import HANDLER, WOKEN_TAG

REGION = "cn-northwest-1"
GROUP = "IntelMoeStack-ServingGroup-ABC"
WAKE_S = 382
KEY = "sk-test"


@pytest.fixture
def world(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    with mock_aws():
        clients = {s: boto3.client(s, region_name=REGION) for s in ("ec2", "elbv2", "autoscaling", "secretsmanager")}
        secret = clients["secretsmanager"].create_secret(Name="api-key", SecretString=KEY)["ARN"]
        front = build_front(clients["ec2"], clients["elbv2"])
        image = clients["ec2"].describe_images()["Images"][0]["ImageId"]
        lt = clients["ec2"].create_launch_template(
            LaunchTemplateName="serving", LaunchTemplateData={"ImageId": image, "InstanceType": "c8i.4xlarge"}
        )["LaunchTemplate"]["LaunchTemplateId"]
        clients["autoscaling"].create_auto_scaling_group(
            AutoScalingGroupName=GROUP,
            LaunchTemplate={"LaunchTemplateId": lt},
            MinSize=0,
            MaxSize=4,
            DesiredCapacity=0,
            VPCZoneIdentifier=",".join(front.subnets),
            TargetGroupARNs=[front.servers],
        )
        door = load_door(monkeypatch, front, group=GROUP, wake_s=WAKE_S, secret=secret)
        yield SimpleNamespace(
            door=door, elbv2=clients["elbv2"], autoscaling=clients["autoscaling"], servers=front.servers,
            door_tg=front.door, listener=front.listener,
        )  # fmt: skip


@dataclass(frozen=True)
class Front:
    subnets: list[str]
    listener: str
    servers: str
    door: str


def build_front(ec2, elbv2) -> Front:
    """The load balancer as WakeDoor leaves it: the listener's one rule forwarding to the servers (weight 1) and
    the door's Lambda target group (weight 0)."""
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.40.{i}.0/24", AvailabilityZone=f"{REGION}{z}")["Subnet"]["SubnetId"]
        for i, z in enumerate("ab")
    ]
    lb = elbv2.create_load_balancer(Name="serving", Subnets=subnets, Scheme="internal")["LoadBalancers"][0]
    servers = elbv2.create_target_group(Name="servers", Protocol="HTTP", Port=8080, VpcId=vpc)
    servers_arn = servers["TargetGroups"][0]["TargetGroupArn"]
    door_arn = elbv2.create_target_group(Name="door", TargetType="lambda")["TargetGroups"][0]["TargetGroupArn"]
    forward = {"Type": "forward", "TargetGroupArn": servers_arn}
    listener = elbv2.create_listener(
        LoadBalancerArn=lb["LoadBalancerArn"], Protocol="HTTP", Port=80, DefaultActions=[forward]
    )["Listeners"][0]["ListenerArn"]
    groups = [{"TargetGroupArn": servers_arn, "Weight": 1}, {"TargetGroupArn": door_arn, "Weight": 0}]
    elbv2.create_rule(
        ListenerArn=listener,
        Priority=1,
        Conditions=[{"Field": "path-pattern", "Values": ["/*"]}],
        Actions=[{"Type": "forward", "ForwardConfig": {"TargetGroups": groups}}],
    )
    return Front(subnets, listener, servers_arn, door_arn)


def load_door(monkeypatch, front: Front, *, group: str, wake_s: int, secret: str):
    """The handler module as the Lambda runtime loads it, with the environment WakeDoor gives it."""
    env = {
        "GROUP_NAME": group,
        "LISTENER_ARN": front.listener,
        "SERVERS_TARGET_GROUP_ARN": front.servers,
        "WAKE_S": str(wake_s),
        "WOKEN_TAG": WOKEN_TAG,
        "API_KEY_SECRET_ARN": secret,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("wake_door_handler", HANDLER)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def alb_request(door_tg: str) -> dict:
    """The event an ALB sends a Lambda target (ELB User Guide, "Lambda functions as targets": receive events)."""
    return {
        "requestContext": {"elb": {"targetGroupArn": door_tg}},
        "httpMethod": "POST",
        "path": "/v1/chat/completions",
        "headers": {"content-type": "application/json", "authorization": "Bearer sk-test"},
        "body": json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        "isBase64Encoded": False,
    }


def weights(w) -> dict[str, int]:
    rules = [r for r in w.elbv2.describe_rules(ListenerArn=w.listener)["Rules"] if not r["IsDefault"]]
    (rule,) = rules
    (action,) = rule["Actions"]
    return {t["TargetGroupArn"]: t["Weight"] for t in action["ForwardConfig"]["TargetGroups"]}


def group(w) -> dict:
    (g,) = w.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    return g


def test_the_last_instance_leaving_routes_requests_to_the_door(world):
    assert weights(world) == {world.servers: 1, world.door_tg: 0}
    out = world.door.handler({"source": "aws.autoscaling", "detail-type": "EC2 Instance Terminate Successful"}, None)
    assert out == {"routed": "door", "in_service": 0}
    assert weights(world) == {world.servers: 0, world.door_tg: 1}


def test_a_request_at_zero_wakes_the_group_and_says_when_to_retry(world):
    world.door.handler({"source": "aws.events", "detail-type": "Scheduled Event"}, None)
    answer = world.door.handler(alb_request(world.door_tg), None)
    assert answer["statusCode"] == 503 and answer["isBase64Encoded"] is False
    retry = int(answer["headers"]["Retry-After"])
    assert WAKE_S - 5 <= retry <= WAKE_S
    error = json.loads(answer["body"])["error"]
    assert error["code"] == "waking" and f"about {retry} s" in error["message"]
    g = group(world)
    assert g["DesiredCapacity"] == 1
    tags = {t["Key"]: t["Value"] for t in g["Tags"]}
    assert WOKEN_TAG in tags and tags[WOKEN_TAG].isdigit()


def test_later_requests_count_down_and_do_not_wake_it_twice(world, monkeypatch):
    world.door.handler({"source": "aws.events"}, None)
    clock = [1_800_000_000.0]
    monkeypatch.setattr(world.door.time, "time", lambda: clock[0])
    first = int(world.door.handler(alb_request(world.door_tg), None)["headers"]["Retry-After"])
    # moto puts a launched instance InService at once; a real one is Pending (user data, the launch hook) for
    # minutes: read the group as that.
    monkeypatch.setattr(world.door, "in_service", lambda g: [])
    clock[0] += 100
    second = int(world.door.handler(alb_request(world.door_tg), None)["headers"]["Retry-After"])
    assert first == WAKE_S and second == WAKE_S - 100
    clock[0] += 10 * WAKE_S
    assert world.door.handler(alb_request(world.door_tg), None)["headers"]["Retry-After"] == "5"  # overdue: soon
    assert group(world)["DesiredCapacity"] == 1


def test_an_instance_in_service_routes_requests_back_and_clears_the_wake(world):
    world.door.handler({"source": "aws.events"}, None)
    world.door.handler(alb_request(world.door_tg), None)  # wakes: moto launches the instance InService
    (instance,) = group(world)["Instances"]
    world.elbv2.register_targets(TargetGroupArn=world.servers, Targets=[{"Id": instance["InstanceId"], "Port": 8080}])
    out = world.door.handler({"source": "aws.autoscaling", "detail-type": "EC2 Instance Launch Successful"}, None)
    assert out == {"routed": "servers", "in_service": 1}
    assert weights(world) == {world.servers: 1, world.door_tg: 0}
    assert {t["Key"]: t["Value"] for t in group(world)["Tags"]}[WOKEN_TAG] == ""


def test_a_lost_launch_event_is_put_right_by_the_next_request(world):
    world.door.handler({"source": "aws.events"}, None)
    world.door.handler(alb_request(world.door_tg), None)
    (instance,) = group(world)["Instances"]
    world.elbv2.register_targets(TargetGroupArn=world.servers, Targets=[{"Id": instance["InstanceId"], "Port": 8080}])
    answer = world.door.handler(alb_request(world.door_tg), None)  # the launch event never came
    assert answer["statusCode"] == 503 and answer["headers"]["Retry-After"] == "5"
    assert weights(world) == {world.servers: 1, world.door_tg: 0}


def test_a_group_held_at_zero_is_not_woken(world):
    world.autoscaling.update_auto_scaling_group(AutoScalingGroupName=GROUP, MaxSize=0)
    world.door.handler({"source": "aws.events"}, None)
    answer = world.door.handler(alb_request(world.door_tg), None)
    assert answer["statusCode"] == 503 and "held at zero" in json.loads(answer["body"])["error"]["message"]
    assert group(world)["DesiredCapacity"] == 0
