"""ServingNetwork alone: private subnets, NAT gateways, the S3 gateway and interface endpoints, flow logs."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from gguf_serve.catalog.fleet import NetworkSettings
from stacks.errors import PropsError
from stacks.network import ServingNetwork


def test_vpc_endpoints_and_flow_logs(stack):
    ServingNetwork(stack, "Network", settings=NetworkSettings())
    t = Template.from_stack(stack)
    t.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.40.0.0/16"})
    t.resource_count_is("AWS::EC2::NatGateway", 1)
    t.resource_count_is("AWS::EC2::VPCEndpoint", 9)  # S3 gateway and eight interface endpoints
    t.has_resource_properties("AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway"})
    t.has_resource_properties("AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Interface", "PrivateDnsEnabled": True})
    t.resource_count_is("AWS::EC2::FlowLog", 1)
    t.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "ALL", "ResourceType": "VPC"})
    groups = t.find_resources("AWS::EC2::SecurityGroup")
    rules = [r for g in groups.values() for r in g["Properties"].get("SecurityGroupIngress", [])]
    assert rules and all((r["CidrIp"], r["FromPort"]) == ("10.40.0.0/16", 443) for r in rules)


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"vpc_cidr": "10.40.0.0"}, r"vpc_cidr 10.40.0.0 is a /32; use a /16 to /24"),
        ({"vpc_cidr": "not-a-cidr"}, r"not an IPv4 network; write e.g. 10.40.0.0/16"),
        ({"max_azs": 0}, r"max_azs 0 must be 1-6"),
        ({"nat_gateways": 3}, r"nat_gateways 3 must be 0 to max_azs \(2\)"),
    ],
)
def test_props_are_checked(stack, props, message):
    with pytest.raises(PropsError, match=message):
        ServingNetwork(stack, "Network", settings=NetworkSettings(**props))
