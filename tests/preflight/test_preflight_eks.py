"""The EKS pre-flight against botocore's Stubber (every call checked against the service's API model): a ready
account, and one broken thing at a time: the version not offered, a Bottlerocket variant not published, a GPU quota
too small for a rollout, a service-linked role absent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gguf_serve.preflight.checks import Status
from gguf_serve.preflight.eks import SERVICE_LINKED, eks_plan_from, run_eks_checks
from gguf_serve.preflight.plan import G_AND_VT_ON_DEMAND, STANDARD_ON_DEMAND, STANDARD_SPOT
from stacks.options import DeployOptionError
from tests.conftest import cdk_context

REGION = "cn-northwest-1"


@pytest.fixture(scope="module")
def plan():
    return eks_plan_from({**cdk_context(), "eksProfiles": "graviton-moe,gpu-mtp"})


class Account:
    def __init__(self, plan) -> None:
        self.plan = plan
        self.versions = [{"clusterVersion": "1.35", "versionStatus": "STANDARD_SUPPORT",
                          "endOfStandardSupportDate": "2026-07-29T00:00:00Z"}]  # fmt: skip
        self.unpublished: set[str] = set()
        self.quotas = {STANDARD_ON_DEMAND: 512.0, G_AND_VT_ON_DEMAND: 64.0, STANDARD_SPOT: 512.0}
        self.roles = set(SERVICE_LINKED)

    def check(self):
        made: dict[str, Any] = {
            s: boto3.client(s, region_name=REGION, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x")
            for s in ("eks", "ssm", "iam", "ec2", "service-quotas")
        }
        stub = {name: Stubber(c) for name, c in made.items()}
        stub["eks"].add_response(
            "describe_cluster_versions", {"clusterVersions": self.versions}, {"clusterVersions": ["1.35"]}
        )
        for _, parameter in self.plan.amis:
            if parameter in self.unpublished:
                stub["ssm"].add_client_error("get_parameter", "ParameterNotFound", expected_params={"Name": parameter})
            else:
                stub["ssm"].add_response(
                    "get_parameter",
                    {"Parameter": {"Name": parameter, "Value": "ami-0123456789abcdef0"}},
                    {"Name": parameter},
                )
        for role in SERVICE_LINKED:
            if role in self.roles:
                stub["iam"].add_response(
                    "get_role",
                    {
                        "Role": {
                            "Path": "/aws-service-role/",
                            "RoleName": role,
                            "RoleId": "AROAEXAMPLEID0000000",
                            "Arn": f"arn:aws-cn:iam::111122223333:role/{role}",
                            "CreateDate": "2026-01-01T00:00:00Z",
                        }
                    },
                    {"RoleName": role},
                )
            else:
                stub["iam"].add_client_error("get_role", "NoSuchEntity", expected_params={"RoleName": role})
        for s in self.plan.nodes.stacks:
            for t in (s.instance_type, *s.spot_instance_types):
                offers = [{"InstanceType": t, "LocationType": "availability-zone", "Location": z} for z in s.zones]
                stub["ec2"].add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": offers})
        codes = {c for s in self.plan.nodes.stacks for c in (s.quota_code, s.spot_quota_code) if c}
        for code in sorted(codes):
            stub["service-quotas"].add_response(
                "get_service_quota", {"Quota": {"QuotaCode": code, "QuotaName": code, "Value": self.quotas[code]}},
                {"ServiceCode": "ec2", "QuotaCode": code},
            )  # fmt: skip
        for s in stub.values():
            s.activate()
        results = run_eks_checks(self.plan, made.__getitem__)
        for s in stub.values():
            s.assert_no_pending_responses()
        return results


def _status(results, starts: str) -> Status:
    [found] = [r for r in results if r.check.startswith(starts)]
    return found.status


def test_a_ready_account_passes_and_every_node_group_is_checked(plan):
    results = Account(plan).check()
    assert [r for r in results if r.status is not Status.OK] == []
    assert {p for _, p in plan.amis} == {
        "/aws/service/bottlerocket/aws-k8s-1.35/aarch64/latest/image_id",
        "/aws/service/bottlerocket/aws-k8s-1.35-nvidia/x86_64/latest/image_id",
    }
    gpu = next(s for s in plan.nodes.stacks if s.instance_type == "g5.xlarge")
    assert gpu.vcpus == {"create": 4, "update": 8, "scale_out": 20}  # one pod, a surge node, four pods and a surge


def test_a_version_not_offered_is_a_blocker(plan):
    account = Account(plan)
    account.versions = []
    assert _status(account.check(), "EKS Kubernetes") is Status.BLOCKER


def test_an_unpublished_bottlerocket_variant_is_a_blocker(plan):
    account = Account(plan)
    account.unpublished = {p for g, p in plan.amis if g == "gpu-mtp"}
    assert _status(account.check(), "Bottlerocket AMI gpu-mtp") is Status.BLOCKER


def test_a_gpu_quota_too_small_for_a_rollout_is_a_blocker(plan):
    account = Account(plan)
    account.quotas[G_AND_VT_ON_DEMAND] = 4.0
    assert _status(account.check(), f"vCPU quota {G_AND_VT_ON_DEMAND}") is Status.BLOCKER


def test_an_absent_service_linked_role_is_a_warning_that_names_the_principal(plan):
    account = Account(plan)
    account.roles = set()
    results = account.check()
    warned = [r for r in results if r.check.startswith("IAM ")]
    assert {r.status for r in warned} == {Status.WARN}
    assert any("eks-nodegroup.amazonaws.com" in r.todo for r in warned)


def test_no_profiles_or_an_unknown_one_is_one_line():
    with pytest.raises(DeployOptionError, match="eksProfiles=graviton-moe"):
        eks_plan_from({**cdk_context(), "eksProfiles": ""}, config_file=Path("/nonexistent.toml"))
    with pytest.raises(DeployOptionError, match="no serving profile named nope"):
        eks_plan_from({**cdk_context(), "eksProfiles": "nope"})


def test_extended_support_is_a_warning_with_what_to_raise(plan):
    account = Account(plan)
    account.versions = [{"clusterVersion": "1.35", "versionStatus": "EXTENDED_SUPPORT",
                         "endOfStandardSupportDate": "2027-03-27T00:00:00Z"}]  # fmt: skip
    [version] = [r for r in account.check() if r.check.startswith("EKS Kubernetes")]
    assert version.status is Status.WARN and "extended fee" in version.detail and "2027-03-27" in version.detail
    assert "KUBERNETES_VERSION" in version.todo


def test_on_spot_the_floor_runs_on_demand_and_the_rest_on_spot_over_several_types():
    spot = eks_plan_from({**cdk_context(), "eksProfiles": "graviton-moe", "spot": "true"})
    [nodes] = [s for s in spot.nodes.stacks if s.instance_type == "c8g.4xlarge"]
    assert nodes.vcpus == {"create": 16, "update": 16, "scale_out": 16}  # the On-Demand floor: one node
    assert nodes.spot_vcpus == {"create": 0, "update": 16, "scale_out": 64}  # a surge, then up to four more
    assert nodes.spot_instance_types == ("m8g.4xlarge",) and nodes.spot_quota_code == STANDARD_SPOT
    account = Account(spot)
    account.quotas[STANDARD_SPOT] = 32.0  # a rollout fits, full scale-out does not
    [quota] = [r for r in account.check() if STANDARD_SPOT in r.check]
    assert quota.status is Status.WARN


def test_the_cluster_stack_gets_the_checks_every_stack_gets():
    """EksServingStack's template through the pre-flight every stack goes through: its image builds (the CUDA base on
    XLARGE), the bootstrap, its VPC and NAT gateway, endpoint services, the kubectl handler's Lambda."""
    from gguf_serve.preflight.plan import deploy_plan
    from stacks.eks.stack import STACK_NAME
    from tests.preflight.account import Account as StackAccount

    whole = deploy_plan([STACK_NAME], context={**cdk_context(), "eksProfiles": "graviton-moe,gpu-mtp"})
    [cluster] = whole.clusters
    assert whole.stacks == () and whole.endpoints == () and [s.stack_name for s in whole.planned()] == [STACK_NAME]
    assert {c for _, _, c in cluster.build_images} == {"BUILD_GENERAL1_LARGE", "BUILD_GENERAL1_XLARGE"}
    assert cluster.network.vpcs == 1 and cluster.network.nat_gateways and cluster.functions
    assert cluster.bootstrap_version > 0 and cluster.endpoint_services
    results = StackAccount(whole).check()
    assert not [r for r in results if r.status is Status.BLOCKER], results
    checked = {r.check for r in results}
    assert "CodeBuild concurrency LINUX_CONTAINER BUILD_GENERAL1_XLARGE" in checked
    assert {"CDK bootstrap", "VPC endpoint services", "Lambda concurrency", "VPCs per Region"} <= checked

    class NoXLarge(StackAccount):  # an account whose XLarge builds are capped at zero
        def _codebuild(self, stub) -> None:
            images = [{"name": n, "description": "", "versions": []} for n in sorted(self.curated)]
            platforms = [{"platform": "AMAZON_LINUX_2023", "languages": [{"language": "STANDARD", "images": images}]}]
            stub["codebuild"].add_response("list_curated_environment_images", {"platforms": platforms})
            quotas = [
                {"QuotaCode": f"L-{size}", "Value": 0.0 if size == "XLarge" else 1.0, "ServiceCode": "codebuild",
                 "QuotaName": f"Concurrently running builds for Linux/{size} environment"}
                for size in ("Large", "XLarge")
            ]  # fmt: skip
            stub["service-quotas"].add_response("list_service_quotas", {"Quotas": quotas}, {"ServiceCode": "codebuild"})

    [xlarge] = [r for r in NoXLarge(whole).check() if r.check.endswith("BUILD_GENERAL1_XLARGE")]
    assert xlarge.status is Status.BLOCKER and "L-XLarge >= 1" in xlarge.todo
