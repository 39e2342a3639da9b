"""What the stacks' VPCs ask of the region: the network quotas, and each endpoint service in each pinned zone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from botocore.exceptions import ClientError

from gguf_serve.preflight.plan import ClusterPlan, DeployPlan, EndpointPlan, StackPlan
from gguf_serve.preflight.results import Clients, Result, Status

Planned = StackPlan | EndpointPlan | ClusterPlan


@dataclass(frozen=True)
class Quota:
    service: str
    code: str
    name: str


# Names and defaults (5 each): Amazon VPC User Guide, "Amazon VPC quotas" (docs.amazonaws.cn/en_us/vpc/latest/
# userguide/amazon-vpc-limits.html): VPCs per Region (its increase raises internet gateways per Region with it),
# Internet gateways per Region, NAT gateways per Availability Zone (counted while pending, active or deleting),
# Elastic IP addresses per Region. The codes are those `aws service-quotas list-service-quotas --service-code vpc`
# (and ec2) list, as public quota checkers use them (cortexlabs/cortex, pkg/types/clusterconfig: VerifyNetworkQuotas);
# not verified in a China account here: a code the region lacks is reported as "could not check", never as a pass.
VPCS = Quota("vpc", "L-F678F1CE", "VPCs per Region")
INTERNET_GATEWAYS = Quota("vpc", "L-A4707A72", "Internet gateways per Region")
NAT_GATEWAYS_PER_ZONE = Quota("vpc", "L-FE5A380F", "NAT gateways per Availability Zone")
ELASTIC_IPS = Quota("ec2", "L-0263D0A3", "EC2-VPC Elastic IPs")
_NAT_STATES = ["pending", "available", "deleting"]
_GONE = ("ROLLBACK_COMPLETE", "DELETE_COMPLETE")  # a stack that holds none of its resources


def network_quotas(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    """Each stack creates a VPC with an internet gateway and its NAT gateways, each with an Elastic IP; stacks
    already deployed hold theirs. What the others need, added up, plus what the region already uses, must fit."""
    new = _not_deployed(plan, client)
    if not new:
        yield Result("network quotas", Status.OK, "every selected stack is deployed: its VPC and gateways exist")
        return
    ec2, quotas = client("ec2"), client("service-quotas")
    names = "+".join(s.stack_name for s in new)
    regional: list[tuple[Quota, int, Callable[[], int]]] = [
        (VPCS, sum(s.network.vpcs for s in new), lambda: _count(ec2, "describe_vpcs", "Vpcs")),
        (INTERNET_GATEWAYS, sum(s.network.internet_gateways for s in new),
         lambda: _count(ec2, "describe_internet_gateways", "InternetGateways")),
        (ELASTIC_IPS, sum(s.network.elastic_ips for s in new), lambda: len(ec2.describe_addresses()["Addresses"])),
    ]  # fmt: skip
    for quota, need, in_use in regional:
        if need:
            yield _fits(quota, quota.name, _value(quotas, quota), in_use(), need, names, plan.region)
    per_zone: Counter[str] = Counter()
    for s in new:
        per_zone.update(dict(s.network.nat_gateways))
    if per_zone:
        value, in_use_per_zone = _value(quotas, NAT_GATEWAYS_PER_ZONE), _nat_gateways_per_zone(ec2)
        for zone, need in sorted(per_zone.items()):
            title = f"{NAT_GATEWAYS_PER_ZONE.name} ({zone})"
            yield _fits(NAT_GATEWAYS_PER_ZONE, title, value, in_use_per_zone[zone], need, names, plan.region)


def endpoint_services(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    """Each endpoint service in every zone its subnets are in: an interface endpoint places a network interface in
    each, and CreateVpcEndpoint refuses a zone the service is not in ("The VPC endpoint service ... does not
    support the Availability Zone of the subnet", AWS Knowledge Center, interface-endpoint-availability-zone);
    DescribeVpcEndpointServices lists each service's AvailabilityZones (EC2 API Reference, ServiceDetail)."""
    wanted: dict[str, set[str]] = {}
    for s in plan.planned():  # the EC2, SageMaker and EKS stacks' networks
        for name, zones in s.endpoint_services:
            wanted.setdefault(name, set()).update(zones)
    offered: dict[str, set[str]] = {}
    ec2, token = client("ec2"), None
    while True:  # DescribeVpcEndpointServices has no paginator in older botocore models
        page = ec2.describe_vpc_endpoint_services(**({"NextToken": token} if token else {}))
        for detail in page.get("ServiceDetails", []):
            offered.setdefault(detail["ServiceName"], set()).update(detail.get("AvailabilityZones", []))
        if not (token := page.get("NextToken")):
            break
    missing = sorted(set(wanted) - set(offered))
    if missing:
        yield Result(
            "VPC endpoint services",
            Status.BLOCKER,
            f"not offered: {', '.join(missing)}",
            "remove them from stacks/network.py or pick another region",
        )
    for name in sorted(set(wanted) & set(offered)):
        if lacking := sorted(wanted[name] - offered[name]):
            yield Result(
                f"VPC endpoint {name}",
                Status.BLOCKER,
                f"not offered in {', '.join(lacking)} (offered in: {', '.join(sorted(offered[name])) or 'none'})",
                "pin zones that offer it in cdk.context.json 'pinned-availability-zones'",
            )
    if not missing and all(wanted[n] <= offered[n] for n in wanted):
        yield Result("VPC endpoint services", Status.OK, f"all {len(wanted)} offered in the pinned zones")


def _not_deployed(plan: DeployPlan, client: Clients) -> list[Planned]:
    cloudformation, new = client("cloudformation"), []
    for s in plan.planned():  # a SageMaker endpoint's VPC and the cluster's count as an EC2 stack's
        try:
            (stack,) = cloudformation.describe_stacks(StackName=s.stack_name)["Stacks"]
        except ClientError as e:
            if "does not exist" not in str(e):
                raise
            new.append(s)
            continue
        if stack["StackStatus"] in _GONE:
            new.append(s)
    return new


def _value(quotas, quota: Quota) -> int | None:
    """The applied value, else the default (GetServiceQuota answers NoSuchResourceException for some quotas that
    were never changed), else None: the code is not known here."""
    for call in (quotas.get_service_quota, quotas.get_aws_default_service_quota):
        try:
            return int(call(ServiceCode=quota.service, QuotaCode=quota.code)["Quota"]["Value"])
        except ClientError as e:
            if e.response["Error"]["Code"] != "NoSuchResourceException":
                raise
    return None


def _count(ec2, operation: str, key: str) -> int:
    return sum(len(page[key]) for page in ec2.get_paginator(operation).paginate())


def _nat_gateways_per_zone(ec2) -> Counter[str]:
    gateways = [
        g
        for page in ec2.get_paginator("describe_nat_gateways").paginate(
            Filters=[{"Name": "state", "Values": _NAT_STATES}]
        )
        for g in page["NatGateways"]
    ]
    subnets = sorted({g["SubnetId"] for g in gateways})
    if not subnets:
        return Counter()
    zone = {s["SubnetId"]: s["AvailabilityZone"] for s in ec2.describe_subnets(SubnetIds=subnets)["Subnets"]}
    return Counter(zone[g["SubnetId"]] for g in gateways)


def _fits(quota: Quota, title: str, value: int | None, in_use: int, need: int, names: str, region: str) -> Result:
    if value is None:
        return Result(title, Status.WARN, f"could not read {quota.service} quota {quota.code}",
                      f"check {quota.name} in the Service Quotas console ({region})")  # fmt: skip
    detail = f"{value} allowed, {in_use} in use; {names} add {need}"
    if in_use + need > value:
        return Result(
            title,
            Status.BLOCKER,
            detail,
            f"request {quota.code} >= {in_use + need} in Service Quotas ({region}), or release unused ones",
        )
    return Result(title, Status.OK, detail)
