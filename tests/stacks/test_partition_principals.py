"""Every trust the app writes is right for the China partition: one walk over every synthesized template (the three
whole-app option sets, EC2 and SageMaker stacks, and EksServingStack with its node groups) against the table in
stacks/principals.py, whose rows each carry their source. The negative controls build the regression this guards
against: an EKS node group left with aws_eks_v2's own role, which trusts ec2.amazonaws.com only."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

from stacks.principals import CHINA_TRUST, service_of
from tests.conftest import cdk_context
from tests.whole_app import OPTION_SETS

REGION_FACTS = {  # partition and domain suffix, from the region's own pages (docs.amazonaws.cn: endpoints)
    "cn-northwest-1": ("aws-cn", "amazonaws.com.cn"),
    "cn-north-1": ("aws-cn", "amazonaws.com.cn"),
}


def _names(value: Any) -> list[str]:
    """A Service value as its names: a string, a list of them, or CDK's Fn::Join of a name and AWS::URLSuffix."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [n for v in value for n in _names(v)]
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return [sep.join(p if isinstance(p, str) else "<URLSuffix>" for p in parts)]
    raise AssertionError(f"a service principal CDK did not write: {value}")


def trusts(template: dict[str, Any]) -> dict[str, list[list[str]]]:
    """Logical id -> the service names of each statement that names services (roles' trust policies, and every
    resource policy: bucket policies, Lambda permissions)."""
    out: dict[str, list[list[str]]] = {}

    def walk(node: Any, logical: str) -> None:
        if isinstance(node, dict):
            principal = node.get("Principal")
            if isinstance(principal, dict) and "Service" in principal:
                out.setdefault(logical, []).append(_names(principal["Service"]))
            for value in node.values():
                walk(value, logical)
        elif isinstance(node, list):
            for value in node:
                walk(value, logical)

    for logical, resource in template["Resources"].items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Lambda::Permission" and isinstance(props.get("Principal"), str):
            out.setdefault(logical, []).append([props["Principal"]])
        else:
            walk(props, logical)
    return out


def violations(template: dict[str, Any], region: str) -> list[str]:
    partition, suffix = REGION_FACTS[region]
    found = []
    for logical, statements in trusts(template).items():
        for names in statements:
            for service in dict.fromkeys(service_of(n) for n in names):
                rule = CHINA_TRUST.get(service)
                if rule is None:
                    found.append(f"{logical}: {service} has no row in stacks/principals.py CHINA_TRUST (add it with "
                                 "its source)")  # fmt: skip
                    continue
                missing = [n for n in rule.names(service, partition, suffix) if n not in names]
                if missing:
                    found.append(f"{logical}: trusts {names}, {region} needs {missing} too ({rule.source})")
    return found


@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_every_trust_in_the_whole_app_is_what_the_china_partition_wants(whole_apps, option_set):
    app = whole_apps[option_set]
    region = OPTION_SETS[option_set].get("region", "cn-northwest-1")
    checked = 0
    for stack in app.stacks:
        template = app.template(stack)
        assert violations(template, region) == [], stack
        checked += sum(len(s) for s in trusts(template).values())
    assert checked > 40  # the walk reads the trusts (every stack has several roles)


def test_every_eks_node_role_trusts_both_ec2_names(eks_template):
    assert violations(eks_template, "cn-northwest-1") == []
    groups = [r["Properties"] for r in eks_template["Resources"].values() if r["Type"] == "AWS::EKS::Nodegroup"]
    node_roles = {g["NodeRole"]["Fn::GetAtt"][0] for g in groups}
    assert len(node_roles) == len(groups) > 1  # the system group and each profile's, each its own role
    for role in node_roles:
        assert trusts(eks_template)[role] == [["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]]


def _bare(region: str = "cn-northwest-1") -> cdk.Stack:
    app = cdk.App(context=cdk_context())
    return cdk.Stack(app, "Bare", env=cdk.Environment(account="111122223333", region=region))


def test_negative_control_a_node_group_with_the_eks_default_role_is_found():
    stack = _bare()
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=["cn-northwest-1a", "cn-northwest-1b"])
    cluster = eks.Cluster(stack, "Cluster", version=eks.KubernetesVersion.V1_35, vpc=vpc, default_capacity=0,
                          default_capacity_type=eks.DefaultCapacityType.NODEGROUP)  # fmt: skip
    eks.Nodegroup(stack, "Nodes", cluster=cluster)  # no node_role: the regression
    found = violations(cdk.assertions.Template.from_stack(stack).to_json(), "cn-northwest-1")
    assert any("needs ['ec2.amazonaws.com.cn'] too" in v for v in found), found


def test_negative_control_a_service_without_a_row_is_found():
    stack = _bare()
    iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"))
    found = violations(cdk.assertions.Template.from_stack(stack).to_json(), "cn-northwest-1")
    assert found and "scheduler has no row" in found[0]


def test_outside_china_one_name_is_enough():
    rule = CHINA_TRUST["ec2"]
    assert rule.names("ec2", "aws", "amazonaws.com") == ("ec2.amazonaws.com",)
    assert rule.names("ec2", "aws-cn", "amazonaws.com.cn") == ("ec2.amazonaws.com", "ec2.amazonaws.com.cn")


def test_every_trust_behind_a_shared_endpoint_is_what_the_china_partition_wants(shared_templates):
    """SharedEndpointStack (its VPC's flow logs, its load balancer's log bucket) and the EC2 stacks behind it."""
    checked = 0
    for stack, template in shared_templates.items():
        assert violations(template, "cn-northwest-1") == [], stack
        checked += sum(len(s) for s in trusts(template).values())
    assert checked > 30
