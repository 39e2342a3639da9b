"""The EKS cluster: private API endpoint, every control-plane log, envelope-encrypted Secrets, access entries, a
small system node group (CoreDNS and the scalers; the serving nodes are tainted), kubectl from the PyPI layer.

China facts this relies on (docs.amazonaws.cn, Amazon EKS User Guide):
- "Pod Identity is not available in China Regions. Use IAM roles for service accounts" ("EKS Pod Identities"):
  pods get AWS credentials through IRSA (the cluster's OIDC provider).
- EKS Auto Mode is off (`DefaultCapacityType.NODEGROUP`): its managed IAM policies were missing in aws-cn, and it
  brings Karpenter, whose China support needs an `ec2.amazonaws.com.cn` PassRole principal and prices from a list
  that left out g5 (docs/eks.md). Managed node groups are the dependable minimum.
- No ALB controller: CDK's construct pulls its Helm chart from GitHub and its image from a us-west-2 registry. The
  load balancer is a CDK-made ALB (stacks/eks/stack.py).
"""

from __future__ import annotations

import re

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct

from gguf_serve.catalog.hardware import Architecture
from gguf_serve.catalog.images import ImageTarget
from stacks.eks.node_role import node_role
from stacks.eks.workload import NAMESPACE
from stacks.errors import PropsError

# Kubernetes 1.35: in EKS standard support from its EKS release on 2026-01-28 to 2027-03-27, extended support to
# 2028-03-27 (EKS Kubernetes release calendar, "Understand the Kubernetes version lifecycle on EKS", Amazon EKS User
# Guide; 1.33 left standard support on 2026-07-29, 1.34 on 2026-12-02). A cluster on a version past standard support
# runs on extended support, on by default, at a higher hourly fee (the China guide, docs.amazonaws.cn/en_us/eks/
# latest/userguide/kubernetes-versions.html): the pre-flight warns when the account reports that
# (gguf_serve/preflight/eks.py). The kubectl layer's minor version (the PyPI package aws-cdk.lambda-layer-kubectl-v35
# ships kubectl 1.35) is the cluster's: kubectl supports one minor version of skew either way (Kubernetes version
# skew policy).
KUBERNETES_VERSION = eks.KubernetesVersion.V1_35
KUBERNETES_MINOR = "1.35"
STANDARD_SUPPORT_ENDS = "2027-03-27"
SYSTEM_NODES = 2
SYSTEM_LABEL = {"gguf-serve/role": "system"}
ARCH_LABEL = "kubernetes.io/arch"  # the kubelet's own label: arm64 | amd64 (Kubernetes "Well-Known Labels")
# The system nodes (CoreDNS and the scalers) run the architecture of an image the cluster builds anyway: every
# scaler runs that one image (control_target), so no pod on them can meet a node that cannot execute it, and no
# image is built for them alone. Graviton first (the cheapest small nodes), a CPU image before CUDA (a smaller pull).
# Both types are in cfn-lint 1.58's EC2 lists for cn-northwest-1 and cn-north-1; two vCPUs each.
SYSTEM_NODE_TYPES = {Architecture.ARM64: "c6g.large", Architecture.X86_64: "c6i.large"}
SYSTEM_VCPUS = 2
_SYSTEM_AMI = {
    Architecture.ARM64: eks.NodegroupAmiType.BOTTLEROCKET_ARM_64,
    Architecture.X86_64: eks.NodegroupAmiType.BOTTLEROCKET_X86_64,
}
CONTROL_PREFERENCE = ("arm64-cpu", "x86-64-cpu", "cuda")


def control_target(targets: list[ImageTarget]) -> ImageTarget:
    """The image the scalers run, of the cluster's image targets: the first of CONTROL_PREFERENCE it builds."""
    by_name = {t.name: t for t in targets}
    for name in CONTROL_PREFERENCE:
        if name in by_name:
            return by_name[name]
    raise PropsError(f"no image target among {sorted(by_name)} for the system nodes: add it to CONTROL_PREFERENCE")


def kube_arch(architecture: Architecture) -> str:
    """The value of kubernetes.io/arch on a node of this architecture."""
    return "arm64" if architecture == Architecture.ARM64 else "amd64"


_ADMIN_ARN = r"arn:aws[a-z-]*:iam::\d{12}:role/"


class ServingCluster(Construct):
    """Exposes `cluster` (eks.Cluster) and `namespace` (the serving namespace's manifest)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name: str,
        vpc: ec2.IVpc,
        system_architecture: Architecture,
        admin_role_arns: tuple[str, ...] = (),
        auto_mode_fields: bool = True,
    ) -> None:
        """
        name: the cluster's name (IAM conditions name it, so it is fixed, not generated).
        vpc: private subnets with egress for the nodes, the API endpoint and the kubectl handler.
        system_architecture: the system nodes' (control_target's architecture: the scalers' image runs there).
        admin_role_arns: IAM roles given cluster-admin through access entries (-c eksAdminRoles); default none: the
            deploying role administers through the kubectl handler only.
        auto_mode_fields: write Auto Mode's three fields, each disabled (aws_eks_v2 does); False leaves them out of
            CreateCluster for a region that refuses them (-c eksAutoModeFields=false: docs/first-deploy.md).
        """
        _check(name, admin_role_arns)
        super().__init__(scope, construct_id)
        secrets_key = kms.Key(self, "SecretsKey", enable_key_rotation=True, removal_policy=RemovalPolicy.DESTROY)
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=name,
            version=KUBERNETES_VERSION,
            vpc=vpc,
            vpc_subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
            endpoint_access=eks.EndpointAccess.PRIVATE,  # reached from inside the VPC only
            default_capacity=0,
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,  # not Auto Mode (see above)
            cluster_logging=list(_ALL_LOGS),
            secrets_encryption_key=secrets_key,
            kubectl_provider_options=eks.KubectlProviderOptions(kubectl_layer=KubectlV35Layer(self, "Kubectl")),
        )
        if not auto_mode_fields:  # EKS Auto Mode's fields (AWS::EKS::Cluster): absent means off, as written means
            cfn = self.cluster.node.default_child
            for path in ("ComputeConfig", "StorageConfig", "KubernetesNetworkConfig.ElasticLoadBalancing"):
                cfn.add_property_deletion_override(path)  # type: ignore[union-attr]
        for i, arn in enumerate(admin_role_arns):
            eks.AccessEntry(
                self,
                f"Admin{i}",
                cluster=self.cluster,
                principal=arn,
                access_policies=[
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )
        self.system_nodes = self.cluster.add_nodegroup_capacity(
            "SystemNodes",
            instance_types=[ec2.InstanceType(SYSTEM_NODE_TYPES[system_architecture])],
            ami_type=_SYSTEM_AMI[system_architecture],
            min_size=SYSTEM_NODES,
            max_size=SYSTEM_NODES,
            desired_size=SYSTEM_NODES,
            labels=SYSTEM_LABEL,
            node_role=node_role(self, "SystemNodeRole"),
        )
        self.namespace = self.cluster.add_manifest(
            "Namespace",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": NAMESPACE,
                    # Pod Security Standards, restricted: what every serving and scaler pod already is
                    "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                },
            },
        )


_ALL_LOGS = (
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
)


def _check(name: str, admin_role_arns: tuple[str, ...]) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}", name):
        raise PropsError(f"EKS cluster name {name!r}: letters, digits, '-' and '_', at most 100")
    for arn in admin_role_arns:
        if not re.match(_ADMIN_ARN, arn):
            raise PropsError(
                f"eksAdminRoles: {arn!r} is not an IAM role ARN; write arn:aws-cn:iam::<account>:role/<name>"
            )
