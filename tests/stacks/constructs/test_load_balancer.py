"""InferenceLoadBalancer alone: internal ALB, its listener, target group and health check, and its prop checks."""

from __future__ import annotations

import json

import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2_targets as targets
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match, Template

from gguf_serve.catalog.fleet import LoadBalancerSettings
from stacks.errors import PropsError
from stacks.load_balancer import InferenceLoadBalancer

CERT = "arn:aws-cn:acm:cn-northwest-1:111122223333:certificate/0a1b2c3d-1111-2222-3333-444455556666"
IAM_CERT = "arn:aws-cn:iam::111122223333:server-certificate/llama-internal"  # China's usual kind: ACM issues none


def _build(stack, **props):
    vpc = ec2.Vpc(stack, "Vpc", ip_addresses=ec2.IpAddresses.cidr("10.40.0.0/16"))
    defaults = {
        "vpc": vpc,
        "vpc_cidr": "10.40.0.0/16",
        "access_logs": s3.Bucket(stack, "Logs"),
        "targets": [targets.IpTarget("10.40.1.10")],
        "target_port": 8080,
    }
    return InferenceLoadBalancer(stack, "LoadBalancer", **{**defaults, **props})


def test_internal_http_alb_with_a_health_checked_target_group(regional_stack):
    stack = regional_stack
    lb = _build(stack)
    t = Template.from_stack(stack)
    t.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {"Scheme": "internal"})
    t.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {"Port": 80, "Protocol": "HTTP"})
    t.has_resource_properties(
        "AWS::ElasticLoadBalancingV2::TargetGroup",
        {
            "Port": 8080,
            "Protocol": "HTTP",
            "HealthCheckPath": "/health",
            "Matcher": {"HttpCode": "200"},
            "HealthCheckIntervalSeconds": 15,
            "HealthCheckTimeoutSeconds": 5,
            "HealthyThresholdCount": 2,
            "UnhealthyThresholdCount": 3,
            "TargetGroupAttributes": Match.array_with(
                [{"Key": "deregistration_delay.timeout_seconds", "Value": "600"}]
            ),
        },
    )
    t.has_resource_properties(
        "AWS::ElasticLoadBalancingV2::LoadBalancer",
        {"LoadBalancerAttributes": Match.array_with([{"Key": "idle_timeout.timeout_seconds", "Value": "600"}])},
    )
    t.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {"SecurityGroupIngress": [Match.object_like({"CidrIp": "10.40.0.0/16", "FromPort": 80, "ToPort": 80})]},
    )
    assert lb.url.startswith("http://") and lb.port == 80
    assert "dummy" not in json.dumps(t.to_json())


@pytest.mark.parametrize("certificate", [CERT, IAM_CERT], ids=["acm", "iam-server-certificate"])
def test_a_certificate_gives_https_on_443(regional_stack, certificate):
    stack = regional_stack
    lb = _build(stack, certificate_arn=certificate)
    t = Template.from_stack(stack)
    t.has_resource_properties(
        "AWS::ElasticLoadBalancingV2::Listener",
        {"Port": 443, "Protocol": "HTTPS", "Certificates": [{"CertificateArn": certificate}]},
    )
    t.resource_count_is("AWS::ElasticLoadBalancingV2::Listener", 1)
    t.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {"SecurityGroupIngress": [Match.object_like({"CidrIp": "10.40.0.0/16", "FromPort": 443, "ToPort": 443})]},
    )
    assert lb.url.startswith("https://") and lb.port == 443


def test_access_logs_go_to_the_given_bucket_under_alb(regional_stack):
    stack = regional_stack
    _build(stack)
    t = Template.from_stack(stack)
    (bucket,) = t.find_resources("AWS::S3::Bucket")
    t.has_resource_properties(
        "AWS::ElasticLoadBalancingV2::LoadBalancer",
        {
            "LoadBalancerAttributes": Match.array_with(
                [
                    {"Key": "access_logs.s3.enabled", "Value": "true"},
                    {"Key": "access_logs.s3.bucket", "Value": {"Ref": bucket}},
                    {"Key": "access_logs.s3.prefix", "Value": "alb"},
                ]
            )
        },
    )


def test_allowed_cidrs_replace_the_vpc_as_callers(regional_stack):
    stack = regional_stack
    _build(stack, allowed_cidrs=("10.8.0.0/16", "192.168.10.0/24"))
    ingress = Template.from_stack(stack).find_resources("AWS::EC2::SecurityGroup")
    cidrs = {r["CidrIp"] for v in ingress.values() for r in v["Properties"].get("SecurityGroupIngress", [])}
    assert cidrs == {"10.8.0.0/16", "192.168.10.0/24"}


def test_the_delays_are_props(regional_stack):
    stack = regional_stack
    _build(stack, settings=LoadBalancerSettings(alb_idle_timeout_s=900, deregistration_delay_s=30))
    t = Template.from_stack(stack)
    t.has_resource_properties(
        "AWS::ElasticLoadBalancingV2::TargetGroup",
        {"TargetGroupAttributes": Match.array_with([{"Key": "deregistration_delay.timeout_seconds", "Value": "30"}])},
    )


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"target_port": 0}, r"target_port 0 must be 1-65535"),
        (
            {"settings": LoadBalancerSettings(alb_idle_timeout_s=0)},
            r"idle_timeout_s 0 must be 1-4000; set fleet.alb_idle_timeout_s",
        ),
        (
            {"settings": LoadBalancerSettings(deregistration_delay_s=3601)},
            r"deregistration_delay_s 3601 must be 0-3600; set fleet",
        ),
        ({"allowed_cidrs": ("10.8.0.0/33",)}, r"allowed CIDR '10.8.0.0/33' is not a network"),
        ({"certificate_arn": "my-cert"}, r"certificate 'my-cert' is not an ARN"),
    ],
)
def test_props_are_checked_before_anything_is_built(stack, props, message):
    with pytest.raises(PropsError, match=message):
        _build(stack, **props)
    assert stack.node.try_find_child("LoadBalancer") is None
