"""The endpoint's VPC: private subnets without a route out, S3 and ECR reached through VPC endpoints only.

The container itself runs with network isolation (no call in or out). The VPC is where SageMaker attaches the
endpoint's network interfaces (ProductionVariant instances in VpcConfig), and SageMaker fetches the model data
from S3 through them ("Give SageMaker AI Hosted Endpoints Access to Resources in Your Amazon VPC",
https://docs.amazonaws.cn/en_us/sagemaker/latest/dg/host-vpc.html: an S3 VPC endpoint for the model artifacts).
The ECR endpoints serve an image pull that goes through the VPC; whether SageMaker's does in China is open, and
they cost little beside an idle instance. No NAT: nothing here reaches the internet (the model is staged before).
"""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.network import check_network_props, private_vpc

_INTERFACE_ENDPOINTS = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
}


class EndpointNetwork(Construct):
    """Exposes `vpc`, `subnets` (the isolated ones) and `security_group` (the endpoint's: no ingress)."""

    def __init__(self, scope: Construct, construct_id: str, *, cidr: str, max_azs: int) -> None:
        """
        cidr: the VPC's IPv4 range (fleet.vpc_cidr), a /16 to /24.
        max_azs: zones to spread the endpoint's instances over (fleet.max_azs), 1-6.
        """
        check_network_props(cidr, max_azs, 0)
        super().__init__(scope, construct_id)
        self.vpc = private_vpc(
            self, cidr=cidr, max_azs=max_azs, nat_gateways=0,
            subnets=[
                ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=22)
            ],
            interface_endpoints=_INTERFACE_ENDPOINTS,
        )  # fmt: skip
        self.subnets = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED).subnet_ids
        self.security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="SageMaker endpoint instances: no ingress; HTTPS out to the VPC endpoints (no route beyond)",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "ECR interface endpoints")
        # The S3 gateway endpoint is a route, not an address in the VPC: its prefix list is not known at synth.
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "S3 via the gateway endpoint")
