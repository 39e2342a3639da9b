"""Pre-flight for EksServingStack (read-only): what the cluster and its node groups need of the account and region.

- the Kubernetes version is offered by EKS in the region (DescribeClusterVersions);
- each node group's Bottlerocket AMI variant is published there (its public SSM parameter; Bottlerocket's docs,
  "Finding an AMI ID": /aws/service/bottlerocket/aws-k8s-<version>[-nvidia]/<arch>/latest/image_id);
- each instance type is offered in the pinned zones, and the running-vCPU quotas hold the node groups at their
  minimum, during a rollout (one surge node) and fully scaled out (the EC2 stacks' checks, reused);
- the service-linked roles EKS uses (service principals eks.amazonaws.com and eks-nodegroup.amazonaws.com, the same
  names in aws-cn) exist, or the deploying role may create them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gguf_serve.preflight.checks import Clients, Result, Status, instance_offerings, vcpu_quotas
from gguf_serve.preflight.plan import STANDARD_ON_DEMAND, DeployPlan, StackPlan, quota_code
from stacks.app import MODEL_LOCK_CONTEXT, cli_context, stack_profiles
from stacks.eks.cluster import KUBERNETES_MINOR, SYSTEM_NODE_TYPES, SYSTEM_NODES, SYSTEM_VCPUS, control_target
from stacks.eks.stack import STACK_NAME
from stacks.eks.workload import ServingWorkload
from stacks.options import DEPLOY_CONFIG, DeployOptionError, load_options
from stacks.plan import ServicePlan, plan_eks

BOTTLEROCKET = "/aws/service/bottlerocket/aws-k8s-{version}{variant}/{arch}/latest/image_id"
# Service-linked roles EKS creates on first use (Amazon EKS User Guide, "Using service-linked roles for Amazon EKS")
SERVICE_LINKED = {
    "AWSServiceRoleForAmazonEKS": "eks.amazonaws.com",
    "AWSServiceRoleForAmazonEKSNodegroup": "eks-nodegroup.amazonaws.com",
}


@dataclass(frozen=True)
class EksPlan:
    region: str
    version: str
    amis: tuple[tuple[str, str], ...]  # (node group, SSM parameter)
    nodes: DeployPlan  # one StackPlan per node group: instance type, zones, vCPUs by phase, quota


def eks_plan_from(context: dict[str, Any], config_file: Path = DEPLOY_CONFIG) -> EksPlan:
    """The cluster `cdk deploy EksServingStack` would build with these options (deploy.toml, then -c)."""
    ctx = {**cli_context(), **context}
    options = load_options(ctx, config_file)
    if not options.eks_profiles:
        raise DeployOptionError(
            f"{STACK_NAME} serves no profile: add -c eksProfiles=graviton-moe (or eksProfiles in deploy.toml)"
        )
    by_name = {p.name: p for p in stack_profiles(ctx.get(MODEL_LOCK_CONTEXT))}
    zones = tuple((ctx.get("pinned-availability-zones") or {}).get(options.region, []))
    services = plan_eks(by_name, options, zones)
    return eks_plan(services, options.region, list(services[0].vpc_zones))


def eks_plan(services: tuple[ServicePlan, ...], region: str, zones: list[str]) -> EksPlan:
    """services: the cluster's profiles as deployed (stacks/plan.py: Spot, minCapacity applied). On Spot, the
    On-Demand floor holds the minimum (stacks/eks/nodes.py) and the Spot group the rest, over the profile's types."""
    amis, plans = [], []
    for service in services:
        p = service.profile
        assert p is not None  # stack_profiles holds locked profiles only
        w, hw = ServingWorkload.of(p, service.capacity), p.hardware
        arch = "aarch64" if hw.architecture.value == "arm64" else "x86_64"
        variant = "-nvidia" if hw.has_gpu else ""
        amis.append((p.name, BOTTLEROCKET.format(version=KUBERNETES_MINOR, variant=variant, arch=arch)))
        nodes = {"create": w.min_replicas, "update": w.min_replicas + 1, "scale_out": w.max_replicas + 1}
        floor = w.min_replicas if service.spot else None
        on_demand = {k: (floor if floor is not None else n) * hw.vcpus for k, n in nodes.items()}
        plan = _nodes(f"{STACK_NAME}/{p.name}", hw.instance_type, zones, on_demand, quota_code(hw.has_gpu, False))
        if floor is not None:
            plan = replace(
                plan, spot_vcpus={k: (n - floor) * hw.vcpus for k, n in nodes.items()},
                spot_quota_code=quota_code(hw.has_gpu, True), spot_instance_types=service.capacity.spot_instance_types,
            )  # fmt: skip
        plans.append(plan)
    system = {phase: SYSTEM_NODES * SYSTEM_VCPUS for phase in ("create", "update", "scale_out")}
    control = control_target([s.image for s in services]).architecture
    plans.append(_nodes(f"{STACK_NAME}/system", SYSTEM_NODE_TYPES[control], zones, system, STANDARD_ON_DEMAND))
    arch = "aarch64" if control.value == "arm64" else "x86_64"
    amis.append(("system", BOTTLEROCKET.format(version=KUBERNETES_MINOR, variant="", arch=arch)))
    return EksPlan(region, KUBERNETES_MINOR, tuple(amis), DeployPlan(region=region, stacks=tuple(plans)))


def _nodes(name: str, instance_type: str, zones: list[str], vcpus: dict[str, int], quota: str) -> StackPlan:
    return StackPlan(
        stack_name=name, instance_type=instance_type, architecture="", ami_parameter="", root_volume_gib=0,
        zones=tuple(sorted(zones)), vcpus=vcpus, quota_code=quota, build_images=(), endpoint_services=(),
        bootstrap_version=0,
    )  # fmt: skip


def run_eks_checks(plan: EksPlan, client: Clients) -> list[Result]:
    results: list[Result] = []
    for check in (_version, _amis, _service_linked_roles):
        try:
            results.extend(check(plan, client))
        except (ClientError, BotoCoreError) as e:
            results.append(
                Result(check.__name__.strip("_"), Status.WARN, f"could not check: {e}", "grant read-only access")
            )
    for nodes_check in (instance_offerings, vcpu_quotas):
        try:
            results.extend(nodes_check(plan.nodes, client))
        except (ClientError, BotoCoreError) as e:
            results.append(Result(nodes_check.__name__, Status.WARN, f"could not check: {e}", "grant read-only access"))
    return results


def _version(plan: EksPlan, client: Clients) -> Iterator[Result]:
    found = client("eks").describe_cluster_versions(clusterVersions=[plan.version]).get("clusterVersions", [])
    name = f"EKS Kubernetes {plan.version}"
    if not found:
        yield Result(name, Status.BLOCKER, f"not offered in {plan.region}", "deploy where EKS offers it, or wait")
        return
    status = str(found[0].get("versionStatus") or found[0].get("status", ""))
    end = str(found[0].get("endOfStandardSupportDate", ""))[:10]
    if "EXTENDED" in status.upper():
        # A cluster past standard support runs on extended support, at a higher fee per cluster hour, and is
        # upgraded by EKS when that ends ("Understand the Kubernetes version lifecycle on EKS", Amazon EKS User Guide)
        yield Result(
            name, Status.WARN, f"{status}: standard support ended {end or '?'}; the cluster pays the extended fee",
            "raise KUBERNETES_VERSION in stacks/eks/cluster.py to one in standard support (and its kubectl layer)",
        )  # fmt: skip
        return
    yield Result(name, Status.OK, f"{status} (standard support until {end or '?'})")


def _amis(plan: EksPlan, client: Clients) -> Iterator[Result]:
    ssm = client("ssm")
    for group, parameter in plan.amis:
        name = f"Bottlerocket AMI {group}"
        try:
            image = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ParameterNotFound":
                raise
            yield Result(
                name, Status.BLOCKER, f"{parameter} is not published in {plan.region}",
                "EKS cannot launch this AMI type here: pick a region that publishes it",
            )  # fmt: skip
            continue
        yield Result(name, Status.OK, f"{image} ({parameter})")


def _service_linked_roles(plan: EksPlan, client: Clients) -> Iterator[Result]:
    iam = client("iam")
    for role, principal in SERVICE_LINKED.items():
        try:
            iam.get_role(RoleName=role)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
            yield Result(
                f"IAM {role}", Status.WARN, "absent: EKS creates it at the first cluster or node group",
                f"the deploying role needs iam:CreateServiceLinkedRole for {principal}",
            )  # fmt: skip
            continue
        yield Result(f"IAM {role}", Status.OK, f"present ({principal})")
