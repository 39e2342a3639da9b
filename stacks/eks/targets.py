"""A node group's nodes as a target group's targets (stacks/handlers/nodegroup_targets.py says how)."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import ArnFormat, CustomResource, Duration, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import custom_resources as cr
from constructs import Construct

from stacks.eks.acknowledgements import nag_text
from stacks.nag import acknowledge, arn_of

HANDLER = Path(__file__).resolve().parent.parent / "handlers" / "nodegroup_targets.py"
# EKS names a managed node group's Auto Scaling group eks-<node group>-<uuid> (seen in the EKS console and
# DescribeNodegroup; not a documented contract): the handler may touch those groups only.
MANAGED_GROUPS = "autoScalingGroupName/eks-*"


def managed_groups_arn(scope: Construct) -> str:
    """arn:<partition>:autoscaling:<region>:<account>:autoScalingGroup:*:autoScalingGroupName/eks-*"""
    return Stack.of(scope).format_arn(
        service="autoscaling",
        resource="autoScalingGroup",
        resource_name=f"*:{MANAGED_GROUPS}",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class NodegroupTargets(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        nodegroup: eks.Nodegroup,
        target_group: elbv2.ApplicationTargetGroup,
    ) -> None:
        """Attach `nodegroup`'s Auto Scaling group to `target_group` for as long as both exist."""
        super().__init__(scope, construct_id)
        fn = lambda_.Function(
            self,
            "Handler",
            runtime=lambda_.Runtime.PYTHON_3_13,
            handler="index.handler",
            code=lambda_.Code.from_inline(HANDLER.read_text()),
            timeout=Duration.seconds(60),
        )
        fn.add_to_role_policy(
            iam.PolicyStatement(actions=["eks:DescribeNodegroup"], resources=[nodegroup.nodegroup_arn])
        )
        groups = managed_groups_arn(self)
        fn.add_to_role_policy(
            iam.PolicyStatement(
                actions=["autoscaling:AttachLoadBalancerTargetGroups", "autoscaling:DetachLoadBalancerTargetGroups"],
                resources=[groups],
            )
        )
        provider = cr.Provider(self, "Provider", on_event_handler=fn)
        self.resource = CustomResource(
            self,
            "Attachment",
            service_token=provider.service_token,
            resource_type="Custom::NodegroupTargets",
            properties={
                "ClusterName": cluster_name,
                "Nodegroup": nodegroup.nodegroup_name,
                "TargetGroupArn": target_group.target_group_arn,
            },
        )
        _acknowledge(self, fn, provider, groups)


def _acknowledge(scope: Construct, fn: lambda_.Function, provider: cr.Provider, groups: str) -> None:
    acknowledge(fn, "AwsSolutions-L1", "Python 3.13 is supported in the China regions; 3.14 there is not verified.")
    acknowledge(
        scope,
        "AwsSolutions-IAM4",
        "Lambda basic execution role (CloudWatch Logs) for a deploy-time handler.",
        findings=["Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"],
    )
    acknowledge(
        scope,
        "AwsSolutions-IAM5",
        "The node group's Auto Scaling group is named by EKS at deploy (eks-<node group>-<uuid>): the ARN pattern "
        "admits EKS's managed groups only; the provider framework invokes any version of its own handler.",
        findings=[
            f"Resource::{nag_text(scope, groups)}",
            f"Resource::{arn_of(fn)}:*",
        ],
    )
    acknowledge(provider, "AwsSolutions-L1", "The provider framework pins its own Node.js runtime.")
