"""Service principals where the China partition documents a second name beside the one CDK renders."""

from __future__ import annotations

from aws_cdk import Stack, Token, region_info
from aws_cdk import aws_iam as iam
from constructs import Construct


def ec2_principal(scope: Construct) -> iam.IPrincipal:
    """EC2, for an instance role. CDK renders ec2.amazonaws.com in every partition and IAM in aws-cn accepts it;
    China's IAM User Guide (docs.amazonaws.cn, "JSON policy elements: Principal", service principals) says some
    services use service-name.amazonaws.com.cn "instead of or in addition to" that form, and China's IAM console
    writes ec2.amazonaws.com.cn for EC2 (aws/aws-cdk#24709; EKS in cn-northwest-1 refuses a node role that lacks it,
    awslabs/cdk-eks-blueprints#558). So a role in aws-cn trusts both: whichever name EC2 presents there, the
    instance gets its credentials. The second is the region's own domain suffix (CDK's region facts), never typed."""
    principal = iam.ServicePrincipal("ec2.amazonaws.com")
    region = Stack.of(scope).region
    if Token.is_unresolved(region) or region_info.RegionInfo.get(region).partition != "aws-cn":
        return principal
    china = f"ec2.{region_info.RegionInfo.get(region).domain_suffix}"
    return iam.CompositePrincipal(principal, iam.ServicePrincipal.from_static_service_principle_name(china))
