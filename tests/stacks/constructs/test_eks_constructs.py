"""The EKS constructs' props, checked before anything is built, each refusal saying what to change."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2

from gguf_serve.catalog.hardware import Architecture
from stacks.eks.cluster import ServingCluster
from stacks.eks.nodes import ami_type
from stacks.eks.stack import EksServingStack
from stacks.errors import PropsError
from stacks.options import DeployOptions
from stacks.plan import plan_service
from tests.committed import PROFILES

ARM64 = Architecture.ARM64


def test_an_admin_that_is_not_a_role_arn_is_refused(stack: cdk.Stack):
    vpc = ec2.Vpc(stack, "Vpc")
    with pytest.raises(PropsError, match="eksAdminRoles: 'alice' is not an IAM role ARN"):
        ServingCluster(stack, "Cluster", name="c", vpc=vpc, system_architecture=ARM64, admin_role_arns=("alice",))
    with pytest.raises(PropsError, match="cluster name"):
        ServingCluster(stack, "Cluster2", name="bad name", vpc=vpc, system_architecture=ARM64)


def test_the_stack_needs_profiles_named_once(stack: cdk.Stack):
    app = stack.node.scope
    with pytest.raises(PropsError, match="eksProfiles=graviton-moe"):
        EksServingStack(app, "Eks1", plans=[], availability_zones=["cn-northwest-1a"])
    once = plan_service(PROFILES["graviton-moe"], DeployOptions(), ("cn-northwest-1a",))
    with pytest.raises(PropsError, match="names a profile twice"):
        EksServingStack(app, "Eks2", plans=[once, once], availability_zones=["cn-northwest-1a"])


@pytest.mark.parametrize(
    ("profile", "ami"),
    [
        ("graviton-moe", "BOTTLEROCKET_ARM_64"),
        ("intel-moe", "BOTTLEROCKET_X86_64"),
        ("gpu-mtp", "BOTTLEROCKET_X86_64_NVIDIA"),
    ],
)
def test_the_ami_type_follows_the_architecture_and_the_gpu(profile, ami):
    assert ami_type(PROFILES[profile].hardware).value == ami
