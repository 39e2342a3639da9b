"""The role of every managed node group in the cluster (the system group's and each profile's)."""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks.nag import acknowledge
from stacks.principals import ec2_principal

# The policies EKS requires of a node role (Amazon EKS User Guide, "Amazon EKS node IAM role", docs.amazonaws.cn):
# what aws_eks_v2 attaches to the role it would create itself.
NODE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly")


def node_role(scope: Construct, construct_id: str = "NodeRole") -> iam.Role:
    """A managed node group's role, trusting EC2 by the partition's names (stacks/principals.py): aws_eks_v2's own
    role trusts ec2.amazonaws.com only, which CreateNodegroup in the China partition refuses ("Following required
    service principals [ec2.amazonaws.com.cn] were not found in the trust relationships of nodeRole",
    awslabs/cdk-eks-blueprints#558, bottlerocket-os/bottlerocket-update-operator#316)."""
    role = iam.Role(
        scope,
        construct_id,
        assumed_by=ec2_principal(scope),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(p) for p in NODE_POLICIES],
        description="EKS managed node group: kubelet, VPC CNI, image pulls from ECR",
    )
    acknowledge(
        role,
        "AwsSolutions-IAM4",
        "The node role's policies EKS requires (Amazon EKS User Guide, 'Amazon EKS node IAM role', docs.amazonaws.cn).",
        findings=[f"Policy::arn:<AWS::Partition>:iam::aws:policy/{name}" for name in NODE_POLICIES],
    )
    return role
