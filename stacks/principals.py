"""Service principals as the China partition wants them in a trust policy: one table, one helper for every target.

Every role any stack creates (EC2 instances, EKS nodes, CodeBuild, Lambda, SageMaker, the CDK-made ones) is held
to CHINA_TRUST by one whole-app test (tests/stacks/test_partition_principals.py): a role that trusts a service
the table lacks, or lacks a name the table asks for, fails it. A service added to a stack gets a row here, with
its source, before the test passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Stack, Token, region_info
from aws_cdk import aws_iam as iam
from constructs import Construct

CHINA = "aws-cn"
_CDK_DEFAULT = (
    "the global name, which CDK renders in every partition since it dropped its China mappings (aws/aws-cdk#31767 "
    "names the change) and which IAM in aws-cn accepts; no China source asks for a second name (open until a deploy)"
)


@dataclass(frozen=True)
class TrustRule:
    source: str
    regional: bool = False  # in aws-cn, also <service>.<the region's domain suffix> (amazonaws.com.cn)

    def names(self, service: str, partition: str, domain_suffix: str) -> tuple[str, ...]:
        """The names a role trusting `service` lists in that partition."""
        regional = self.regional and partition == CHINA
        return (f"{service}.amazonaws.com", *([f"{service}.{domain_suffix}"] if regional else []))


CHINA_TRUST: dict[str, TrustRule] = {
    # China's IAM User Guide (docs.amazonaws.cn, "JSON policy elements: Principal", service principals): some
    # services use service-name.amazonaws.com.cn "instead of or in addition to" the global form. For EC2, China's IAM
    # console writes ec2.amazonaws.com.cn (aws/aws-cdk#24709, #1282), and EKS in cn-northwest-1 refuses a node role
    # without it at CreateNodegroup ("Following required service principals [ec2.amazonaws.com.cn] were not found in
    # the trust relationships of nodeRole": awslabs/cdk-eks-blueprints#558, bottlerocket-update-operator#316).
    "ec2": TrustRule("EKS CreateNodegroup in aws-cn; China's IAM console", regional=True),
    # IAM in cn-northwest-1 refused lambda.amazonaws.com.cn ("Invalid principal in policy", aws/aws-cdk#2198).
    "lambda": TrustRule("aws/aws-cdk#2198: the .com.cn form is refused"),
    "codebuild": TrustRule(_CDK_DEFAULT),
    "states": TrustRule(_CDK_DEFAULT),
    "sagemaker": TrustRule(_CDK_DEFAULT),
    "eks": TrustRule(_CDK_DEFAULT),
    "vpc-flow-logs": TrustRule(_CDK_DEFAULT),
    # Resource policies (the access-log buckets): S3 server access logging and log delivery.
    "logging.s3": TrustRule(_CDK_DEFAULT),
    "delivery.logs": TrustRule(_CDK_DEFAULT),
    "elasticloadbalancing": TrustRule(_CDK_DEFAULT),
    "events": TrustRule(_CDK_DEFAULT),  # EventBridge invoking the wake door (a Lambda permission)
}


def service_of(name: str) -> str:
    """ec2.amazonaws.com.cn -> ec2; logging.s3.amazonaws.com -> logging.s3."""
    for suffix in (".amazonaws.com.cn", ".amazonaws.com"):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def service_principal(scope: Construct, service: str) -> iam.IPrincipal:
    """The principal for `service` (a CHINA_TRUST key) in the scope's partition: the global name everywhere, and in
    aws-cn every name the table asks for, the regional one from the region's own domain suffix (CDK's region facts),
    never typed."""
    rule, region = CHINA_TRUST[service], Stack.of(scope).region
    if Token.is_unresolved(region):
        return iam.ServicePrincipal(f"{service}.amazonaws.com")
    facts = region_info.RegionInfo.get(region)
    first, *rest = rule.names(service, facts.partition or "", facts.domain_suffix or "")
    principal = iam.ServicePrincipal(first)
    if not rest:
        return principal
    regional = (iam.ServicePrincipal.from_static_service_principle_name(n) for n in rest)
    return iam.CompositePrincipal(principal, *regional)


def ec2_principal(scope: Construct) -> iam.IPrincipal:
    """EC2, for an instance or node role (stacks/fleet.py, stacks/eks/node_role.py)."""
    return service_principal(scope, "ec2")
