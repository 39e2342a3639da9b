"""VPC with private subnets, one NAT for ModelScope, and endpoints so AWS traffic stays in the VPC."""

from __future__ import annotations

import ipaddress

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from gguf_serve.catalog.fleet import NetworkSettings
from stacks.errors import PropsError

_INTERFACE_ENDPOINTS = {
    "Ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "SsmMessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "Ec2Messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "SecretsManager": ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
}


class ServingNetwork(Construct):
    """Public subnets hold only the NAT gateway; instances and the internal ALB live in private subnets."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: NetworkSettings) -> None:
        """settings: the VPC's range, zones and NAT gateways (a profile's [fleet] vpc_cidr, max_azs, nat_gateways)."""
        cidr = settings.vpc_cidr
        check_network_props(cidr, settings.max_azs, settings.nat_gateways)
        super().__init__(scope, construct_id)
        self.vpc = private_vpc(
            self, cidr=cidr, max_azs=settings.max_azs, nat_gateways=settings.nat_gateways,
            subnets=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20),
            ],
            interface_endpoints=_INTERFACE_ENDPOINTS,
        )  # fmt: skip


def private_vpc(
    scope: Construct,
    *,
    cidr: str,
    max_azs: int,
    nat_gateways: int,
    subnets: list[ec2.SubnetConfiguration],
    interface_endpoints: dict[str, ec2.InterfaceVpcEndpointAwsService],
) -> ec2.Vpc:
    """A VPC (`Vpc` in scope) whose traffic is logged (`FlowLogs`, a month), that reaches S3 through a gateway
    endpoint and each of `interface_endpoints` through an interface endpoint open on 443 to the VPC's range only."""
    flow_log_group = logs.LogGroup(
        scope, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
    )
    vpc = ec2.Vpc(
        scope,
        "Vpc",
        ip_addresses=ec2.IpAddresses.cidr(cidr),
        max_azs=max_azs,
        nat_gateways=nat_gateways,
        subnet_configuration=subnets,
        gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        flow_logs={"All": ec2.FlowLogOptions(destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group))},
    )
    for name, service in interface_endpoints.items():
        endpoint = vpc.add_interface_endpoint(name, service=service, private_dns_enabled=True, open=False)
        endpoint.connections.allow_from(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS from the VPC")
    return vpc


def check_network_props(cidr: str, max_azs: int, nat_gateways: int) -> None:
    """The VPC props every network construct takes, refused with the catalog field to change."""
    try:
        network = ipaddress.IPv4Network(cidr)
    except ValueError:
        raise PropsError(f"network: vpc_cidr {cidr!r} is not an IPv4 network; write e.g. 10.40.0.0/16") from None
    if not 16 <= network.prefixlen <= 24:
        raise PropsError(f"network: vpc_cidr {cidr} is a /{network.prefixlen}; use a /16 to /24 (fleet.vpc_cidr)")
    if not 1 <= max_azs <= 6:
        raise PropsError(f"network: max_azs {max_azs} must be 1-6 (fleet.max_azs)")
    if not 0 <= nat_gateways <= max_azs:
        raise PropsError(f"network: nat_gateways {nat_gateways} must be 0 to max_azs ({max_azs}); fleet.nat_gateways")
