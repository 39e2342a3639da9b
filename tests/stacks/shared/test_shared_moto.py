"""SharedEndpointStack and two EC2 stacks behind it, created in moto (cn-northwest-1) in the order `cdk deploy`
creates them, with the bridges of tests/stacks/test_moto_deploy.py: the exports resolve, each fleet's group is in
its own target group, the rules reach the real target groups (the Intel stack's balanced rule the Graviton one's
too), and the security groups let the load balancer in and the fleets onto the route listener only."""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from stacks.load_balancer import ROUTE_PORT
from stacks.shared_endpoint import STACK_NAME
from tests.committed import profile_by_stack
from tests.stacks.test_moto_deploy import REGION, bootstrap, prepare, put_group_hooks, replay
from tests.whole_app import CERT

STACKS = (STACK_NAME, "GravitonMoeStack", "IntelMoeStack")  # Intel balances the 35B over both


def _create(stack: str, template: dict, certificate: str) -> dict[str, str]:
    """Create the stack (its listener's certificate one moto holds); return its logical -> physical ids, with every
    export in the account by name."""
    prepared, replayed, dropped = prepare(json.loads(json.dumps(template).replace(CERT, certificate)))
    assert all(
        d.startswith(("Image", "NetworkVpcRestrictDefaultSecurityGroup", "MonitoringDashboard")) for d in dropped
    )
    for resource in prepared["Resources"].values():  # moto needs a name; one account holds several stacks here
        if resource["Type"] == "AWS::ECR::Repository":
            resource["Properties"]["RepositoryName"] = stack.lower()
    bootstrap(prepared)
    cf = boto3.client("cloudformation", region_name=REGION)
    cf.create_stack(StackName=stack, TemplateBody=json.dumps(prepared), Capabilities=["CAPABILITY_IAM"])
    assert cf.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    physical = {r["LogicalResourceId"]: r["PhysicalResourceId"]
                for r in cf.list_stack_resources(StackName=stack)["StackResourceSummaries"]}  # fmt: skip
    physical.update({e["Name"]: e["Value"] for e in cf.list_exports()["Exports"]})
    put_group_hooks(prepared, physical)
    replay(replayed, physical)
    return physical


def test_the_shared_stack_and_two_fleets_behind_it_create_and_wire_together_in_moto(shared_templates):
    with mock_aws():
        certificate = boto3.client("acm", region_name=REGION).request_certificate(DomainName="llama.internal")
        physical = {stack: _create(stack, shared_templates[stack], certificate["CertificateArn"]) for stack in STACKS}
        elbv2 = boto3.client("elbv2", region_name=REGION)
        autoscaling = boto3.client("autoscaling", region_name=REGION)
        ec2 = boto3.client("ec2", region_name=REGION)
        (lb,) = elbv2.describe_load_balancers()["LoadBalancers"]  # one load balancer for both fleets
        assert lb["Scheme"] == "internal"
        listeners = {
            x["Port"]: x["ListenerArn"]
            for x in elbv2.describe_listeners(LoadBalancerArn=lb["LoadBalancerArn"])["Listeners"]
        }
        assert set(listeners) == {443, ROUTE_PORT}
        groups = {
            g["AutoScalingGroupName"].split("-")[0]: g
            for g in autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
        }
        target_groups = {}
        for stack in STACKS[1:]:
            group = groups[stack]
            (tg,) = group["TargetGroupARNs"]
            target_groups[stack] = tg
            health = elbv2.describe_target_health(TargetGroupArn=tg)["TargetHealthDescriptions"]
            assert {t["Target"]["Id"] for t in health} == {i["InstanceId"] for i in group["Instances"]}
            assert {t["Target"]["Port"] for t in health} == {profile_by_stack(stack).server.port}
        assert len(set(target_groups.values())) == 2
        for port, arn in listeners.items():
            forwards: dict[str, set[str]] = {}
            for rule in elbv2.describe_rules(ListenerArn=arn)["Rules"]:
                if rule["IsDefault"]:
                    assert rule["Actions"][0]["Type"] == "fixed-response"
                    continue
                (action,) = rule["Actions"]
                arns = (
                    {g["TargetGroupArn"] for g in action["ForwardConfig"]["TargetGroups"]}
                    if "ForwardConfig" in action
                    else {action["TargetGroupArn"]}
                )
                (condition,) = rule["Conditions"]
                key = (
                    condition["Field"]
                    if condition["Field"] == "path-pattern"
                    else ",".join(condition["HttpHeaderConfig"]["Values"])
                )
                forwards.setdefault(key, set()).update(arns)
            both = set(target_groups.values())
            assert any(arns == both for arns in forwards.values()), (port, forwards)  # the balanced 35B rule
            if port == 443:
                assert forwards["path-pattern"] == {target_groups["GravitonMoeStack"]}  # the first stack's catch-all
            else:
                assert "path-pattern" not in forwards
        shared_group = lb["SecurityGroups"][0]
        (alb_sg,) = ec2.describe_security_groups(GroupIds=[shared_group])["SecurityGroups"]
        assert {p["FromPort"] for p in alb_sg["IpPermissions"] if p.get("IpRanges")} == {443}
        fleet_sources = {
            p["FromPort"]: {g["GroupId"] for g in p.get("UserIdGroupPairs", [])} for p in alb_sg["IpPermissions"]
        }
        fleet_groups = set()
        for stack in STACKS[1:]:
            instance = groups[stack]["Instances"][0]["InstanceId"]
            (reservation,) = ec2.describe_instances(InstanceIds=[instance])["Reservations"]
            (sg,) = {g["GroupId"] for g in reservation["Instances"][0]["SecurityGroups"]}
            fleet_groups.add(sg)
            (fleet_sg,) = ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"]
            port = profile_by_stack(stack).server.port
            assert [
                (p["FromPort"], [g["GroupId"] for g in p["UserIdGroupPairs"]]) for p in fleet_sg["IpPermissions"]
            ] == [(port, [shared_group])]
        assert fleet_sources.get(ROUTE_PORT) == fleet_groups
        assert physical[STACK_NAME]  # the shared stack created first, its exports read by both
