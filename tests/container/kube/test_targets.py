"""The hop container's hooks on EKS (gguf_serve/container/kube/targets.py): its node out of the target group before
the drain, back in at a start, found by its private IP; against moto's EC2 and ELBv2 in server mode, through the CLI
the manifests run (`lb-leave ... -- <the hop's preStop>` execs that command once the node is out)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import boto3
import pytest
from moto.server import ThreadedMotoServer

from gguf_serve.local.process import free_port
from tests.conftest import ROOT

REGION = "cn-northwest-1"
PORT = 30080


@pytest.fixture
def aws():
    server = ThreadedMotoServer(port=free_port())
    server.start()
    url = f"http://127.0.0.1:{server._port}"  # noqa: SLF001 - moto's own attribute, as its docs use it
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10)  # noqa: S310
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION}  # fmt: skip
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url, aws_access_key_id="t", aws_secret_access_key="t")
    elbv2 = boto3.client("elbv2", region_name=REGION, endpoint_url=url, aws_access_key_id="t",
                         aws_secret_access_key="t")  # fmt: skip
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=f"{REGION}a")["Subnet"]
    [instance] = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, SubnetId=subnet["SubnetId"],
                                   PrivateIpAddress="10.0.1.23")["Instances"]  # fmt: skip
    ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, SubnetId=subnet["SubnetId"],
                      PrivateIpAddress="10.0.1.24")  # fmt: skip  # another node: never touched
    group = elbv2.create_target_group(Name="serving", Protocol="HTTP", Port=PORT, VpcId=vpc, TargetType="instance")
    arn = group["TargetGroups"][0]["TargetGroupArn"]
    yield env, elbv2, arn, instance["InstanceId"]
    server.stop()


def _registered(elbv2, arn: str) -> set[str]:
    return {d["Target"]["Id"] for d in elbv2.describe_target_health(TargetGroupArn=arn)["TargetHealthDescriptions"]}


def _kube(env: dict, *args: str, host_ip: str = "10.0.1.23") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.kube", *args],
        env={**os.environ, **env, "HOST_IP": host_ip, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_post_start_registers_the_node_and_pre_stop_deregisters_it_before_the_drain(aws):
    env, elbv2, arn, instance = aws
    where = ("--target-group", arn, "--port", str(PORT))
    joined = _kube(env, "lb-join", *where)
    assert joined.returncode == 0 and _registered(elbv2, arn) == {instance}, joined.stderr
    drain = [sys.executable, "-c", "print('the hop drains now')"]  # stands for the hop's preStop: run after
    left = _kube(env, "lb-leave", *where, "--settle", "0", "--", *drain)
    assert left.returncode == 0 and "the hop drains now" in left.stdout, left.stderr
    assert "deregistered: no new request reaches it" in left.stderr
    assert _registered(elbv2, arn) == set()


def test_a_hook_that_cannot_reach_the_target_group_still_runs_the_drain_and_never_fails(aws):
    env, elbv2, arn, instance = aws
    drain = [sys.executable, "-c", "print('drained anyway')"]
    unknown = _kube(env, "lb-leave", "--target-group", arn, "--port", str(PORT), "--settle", "0", "--", *drain,
                    host_ip="10.0.9.9")  # fmt: skip  # no instance has this IP
    assert unknown.returncode == 0 and "drained anyway" in unknown.stdout
    assert "could not leave" in unknown.stderr and "0 instances have the private IP 10.0.9.9" in unknown.stderr
    down = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # nothing listens: bounded retries, then the drain
    late = _kube(down, "lb-join", "--target-group", arn, "--port", str(PORT))
    assert late.returncode == 0 and "could not join" in late.stderr
