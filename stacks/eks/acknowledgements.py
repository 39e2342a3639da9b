"""The EKS stack's cdk-nag acknowledgements, each with its reason (the rules' findings are listed exactly)."""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from stacks.nag import acknowledge, arn_of

_MANAGED = "Policy::arn:<AWS::Partition>:iam::aws:policy/"


def acknowledge_cluster(cluster: eks.Cluster) -> None:
    """What aws_eks_v2 itself creates: the cluster's AWS-required role, the kubectl handler."""
    acknowledge(
        cluster,
        "AwsSolutions-IAM4",
        "The policy EKS requires on the cluster role, AmazonEKSClusterPolicy (Amazon EKS User Guide, 'Amazon EKS "
        "cluster IAM role', docs.amazonaws.cn; the node roles acknowledge their own: stacks/eks/node_role.py); CDK's "
        "kubectl handler runs in the VPC (Lambda basic and VPC access) and reads image registries (ECR read-only).",
        findings=[
            f"{_MANAGED}AmazonEKSClusterPolicy",
            f"{_MANAGED}AmazonEC2ContainerRegistryReadOnly",
            f"{_MANAGED}service-role/AWSLambdaBasicExecutionRole",
            f"{_MANAGED}service-role/AWSLambdaVPCAccessExecutionRole",
            'Policy::{"Fn::If":["ClusterKubectlProviderHandlerHasEcrPublic6FE395CA",{"Fn::Join":["",["arn:",{"Ref":'
            '"AWS::Partition"},":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}',
        ],
    )
    handlers = [
        c for c in cluster.node.find_all() if isinstance(c, lambda_.Function) and "KubectlProvider" in c.node.path
    ]
    acknowledge(cluster, "AwsSolutions-L1", "CDK's kubectl handler pins its runtime to the kubectl layer's Python.")
    acknowledge(
        cluster,
        "AwsSolutions-IAM5",
        "The provider framework invokes any version of its own kubectl handler.",
        findings=[f"Resource::{arn_of(fn)}:*" for fn in handlers if "framework" not in fn.node.path],
    )


def acknowledge_pod_roles(scope: Construct, *, cache_objects: str, groups: str) -> None:
    """The pods' and the scaler's IAM roles (IRSA)."""
    acknowledge(
        scope,
        "AwsSolutions-IAM5",
        "Model files under the cache prefix (names come from the profile); the node group's Auto Scaling group, named "
        "by EKS at deploy (eks-<node group>-<uuid>), by that pattern; DescribeAutoScalingGroups and DescribeInstances "
        "(a pod finds its node's instance id) have no resource-level permission (Service Authorization Reference, "
        "Amazon EC2 Auto Scaling, Amazon EC2); PutMetricData has none either and is limited to our namespace by "
        "condition.",
        findings=[f"Resource::{cache_objects}", f"Resource::{groups}", "Resource::*"],
    )


def nag_text(scope: Construct, value: str) -> str:
    """How cdk-nag prints a resource string in a finding: references as <Name> (<Name.Attr> for GetAtt)."""
    resolved = Stack.of(scope).resolve(value)
    if isinstance(resolved, str):
        return resolved
    parts = resolved["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else _reference(p) for p in parts)


def _reference(part: dict) -> str:
    if "Ref" in part:
        return f"<{part['Ref']}>"
    logical, attribute = part["Fn::GetAtt"]
    return f"<{logical}.{attribute}>"
