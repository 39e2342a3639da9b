"""SharedEndpointStack and the EC2 stacks behind it, read from their synthesized templates: the load balancer's rules
evaluated as an ALB evaluates them (lowest priority first, first match wins), each hop's forwards, the stacks'
references, and what each stack owns."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.app import main
from stacks.load_balancer import MODEL_HEADER, ROUTE_PORT
from stacks.shared_endpoint import STACK_NAME
from stacks.shared_fleet import target_group_export
from tests.committed import profile_by_stack
from tests.conftest import ROOT, cdk_context
from tests.stacks.shared.conftest import CONTEXT, MEMBERS

UNKNOWN = "Qwen3-Coder-480B"


def resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in template["Resources"].items() if v["Type"] == kind}


def served(stack: str) -> tuple[str, ...]:
    return profile_by_stack(stack).runtime().model.served_names


def exports(templates: dict[str, dict]) -> dict[str, tuple[str, Any]]:
    """Export name -> (stack, its value) over every template."""
    return {o["Export"]["Name"]: (s, o["Value"]) for s, t in templates.items()
            for o in t.get("Outputs", {}).values() if "Export" in o}  # fmt: skip


def listener_ports(templates: dict[str, dict]) -> dict[str, int]:
    """The shared listeners' export names -> their port."""
    listeners = resources(templates[STACK_NAME], "AWS::ElasticLoadBalancingV2::Listener")
    return {name: listeners[value["Ref"]]["Port"] for name, (stack, value) in exports(templates).items()
            if stack == STACK_NAME and isinstance(value, dict) and value.get("Ref") in listeners}  # fmt: skip


def fleet(stack: str, ref: dict, templates: dict[str, dict]) -> str:
    """The stack whose fleet a rule's target group is: its own (Ref), or a peer's (its export)."""
    if "Ref" in ref:
        assert templates[stack]["Resources"][ref["Ref"]]["Type"] == "AWS::ElasticLoadBalancingV2::TargetGroup"
        return stack
    owner, value = exports(templates)[ref["Fn::ImportValue"]]
    assert templates[owner]["Resources"][value["Ref"]]["Type"] == "AWS::ElasticLoadBalancingV2::TargetGroup"
    return owner


def rules(templates: dict[str, dict], stacks: tuple[str, ...]) -> dict[int, list[tuple[int, Any, frozenset[str]]]]:
    """Listener port -> its rules from `stacks`' templates: (priority, header values or "*" for every path, fleets)."""
    ports = listener_ports(templates)
    found: dict[int, list] = {}
    for stack in stacks:
        for rule in resources(templates[stack], "AWS::ElasticLoadBalancingV2::ListenerRule").values():
            port = ports[rule["ListenerArn"]["Fn::ImportValue"]]
            (condition,) = rule["Conditions"]
            if condition["Field"] == "http-header":
                assert condition["HttpHeaderConfig"]["HttpHeaderName"] == MODEL_HEADER
                match: Any = frozenset(condition["HttpHeaderConfig"]["Values"])
            else:
                assert condition == {"Field": "path-pattern", "PathPatternConfig": {"Values": ["/*"]}}
                match = "*"
            (action,) = rule["Actions"]
            groups = action["ForwardConfig"]["TargetGroups"] if "ForwardConfig" in action else [action]
            assert len({g.get("Weight", 1) for g in groups}) == 1  # equal weight
            fleets = frozenset(fleet(stack, g["TargetGroupArn"], templates) for g in groups)
            found.setdefault(port, []).append((rule["Priority"], match, fleets))
    for port, listed in found.items():
        priorities = [p for p, _, _ in listed]
        assert len(priorities) == len(set(priorities)), f"two rules share a priority on {port}: {sorted(priorities)}"
    return found


def reached(listed: list[tuple[int, Any, frozenset[str]]], model: str | None) -> frozenset[str]:
    """The fleets a request reaches: the first rule that matches, lowest priority first; none: the default action.
    ALB header values match without regard to case (ELB User Guide, "HTTP header conditions")."""
    for _, match, fleets in sorted(listed, key=lambda r: r[0]):
        if match == "*" or (model is not None and model.lower() in {v.lower() for v in match}):
            return fleets
    return frozenset()


def test_every_name_reaches_exactly_the_fleets_that_serve_it_on_both_listeners(shared_templates):
    by_port = rules(shared_templates, MEMBERS)
    main_port = 443  # the certificate's HTTPS listener
    assert set(by_port) == {main_port, ROUTE_PORT}
    names = {n for s in MEMBERS for n in served(s)}
    assert {"Qwen3.6-35B-A3B", "Qwen3.6-27B"} <= names
    for model in names:
        serving = frozenset(s for s in MEMBERS if model in served(s))
        for port in (main_port, ROUTE_PORT):
            assert reached(by_port[port], model) == serving, (model, port)
    # A name no fleet serves, or none at all: the first stack's fleet on the callers' listener (its hop serves or
    # forwards by the body), the listener's 404 on the route listener (a forward is never forwarded again).
    assert reached(by_port[main_port], UNKNOWN) == reached(by_port[main_port], None) == {MEMBERS[0]}
    assert reached(by_port[ROUTE_PORT], UNKNOWN) == frozenset()
    for listener in resources(shared_templates[STACK_NAME], "AWS::ElasticLoadBalancingV2::Listener").values():
        (default,) = listener["DefaultActions"]
        assert default["Type"] == "fixed-response" and default["FixedResponseConfig"]["StatusCode"] == "404"
        assert json.loads(default["FixedResponseConfig"]["MessageBody"])["error"]["code"] == "model_not_found"


def test_a_stack_gone_leaves_the_others_serving_their_names(shared_templates):
    """Each stack's rules are in its own template: without the Intel stack's, its shared name goes to Graviton only,
    and without the first stack's (Intel, which imports its target group, goes first), a request naming no model
    gets the 404, not another fleet's model."""
    without_intel = rules(shared_templates, ("GravitonMoeStack", "GpuMtpStack"))
    for port in without_intel:
        assert reached(without_intel[port], "Qwen3.6-35B-A3B") == {"GravitonMoeStack"}
        assert reached(without_intel[port], "Qwen3.6-27B") == {"GpuMtpStack"}
    gpu_only = rules(shared_templates, ("GpuMtpStack",))
    assert reached(gpu_only[443], None) == reached(gpu_only[443], "Qwen3.6-35B-A3B") == frozenset()
    assert reached(gpu_only[443], "Qwen3.6-27B") == {"GpuMtpStack"}


def user_data(template: dict) -> str:
    (lt,) = resources(template, "AWS::EC2::LaunchTemplate").values()
    joined = lt["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    return "".join(p if isinstance(p, str) else f"<{json.dumps(p)}>" for p in joined["Fn::Join"][1])


@pytest.mark.parametrize("stack", MEMBERS)
def test_each_hop_forwards_the_other_fleets_names_to_the_route_listener(shared_templates, stack):
    text = user_data(shared_templates[stack])
    routes = re.findall(r"--route (\S+)=\$ROUTE_URL", text)
    others = {n for s in MEMBERS if s != stack for n in served(s)}
    assert sorted(routes) == sorted(others - set(served(stack)))  # its own names served here, never forwarded
    (url,) = re.findall(r"^ROUTE_URL='(.*)'$", text, flags=re.M)
    m = re.fullmatch(r'http://<\{"Fn::ImportValue": "([^"]+)"\}>:(\d+)', url)
    assert m and int(m[2]) == ROUTE_PORT
    owner, value = exports(shared_templates)[m[1]]
    assert owner == STACK_NAME and value["Fn::GetAtt"][1] == "DNSName"


def test_the_fleets_stacks_hold_no_network_load_balancer_or_key_of_their_own(shared_templates):
    shared = shared_templates[STACK_NAME]
    for kind in ("AWS::EC2::VPC", "AWS::ElasticLoadBalancingV2::LoadBalancer", "AWS::SecretsManager::Secret"):
        assert len(resources(shared, kind)) == 1, kind
        for stack in MEMBERS:
            assert not resources(shared_templates[stack], kind), (stack, kind)
    (alb,) = resources(shared, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    assert alb["Scheme"] == "internal"
    for stack in MEMBERS:  # each fleet keeps its own group, scaling, alarms, dashboard and target group
        template = shared_templates[stack]
        for kind in ("AWS::AutoScaling::AutoScalingGroup", "AWS::CloudWatch::Dashboard",
                     "AWS::ElasticLoadBalancingV2::TargetGroup"):  # fmt: skip
            assert len(resources(template, kind)) == 1, (stack, kind)
        assert resources(template, "AWS::CloudWatch::Alarm")
        assert resources(template, "AWS::AutoScaling::ScalingPolicy")


def test_callers_reach_the_callers_listener_and_only_the_fleets_reach_the_route_listener(shared_templates):
    shared = shared_templates[STACK_NAME]
    groups = resources(shared, "AWS::EC2::SecurityGroup")
    (alb,) = resources(shared, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    (alb_group,) = [g["Fn::GetAtt"][0] for g in alb["SecurityGroups"]]
    assert [(r["CidrIp"], r["FromPort"]) for r in groups[alb_group]["SecurityGroupIngress"]] == [("10.8.0.0/16", 443)]
    alb_export = next(n for n, (s, v) in exports(shared_templates).items()
                      if s == STACK_NAME and v == {"Fn::GetAtt": [alb_group, "GroupId"]})  # fmt: skip
    for stack in MEMBERS:
        template = shared_templates[stack]
        fleet_group = next(iter(resources(template, "AWS::EC2::SecurityGroup")))
        ingress = [r for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()
                   if r["GroupId"] == {"Fn::ImportValue": alb_export}]  # fmt: skip
        assert [(r["FromPort"], r["SourceSecurityGroupId"]) for r in ingress] == [
            (ROUTE_PORT, {"Fn::GetAtt": [fleet_group, "GroupId"]})
        ]
        port = profile_by_stack(stack).server.port
        into_fleet = [r for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()
                      if r["GroupId"] == {"Fn::GetAtt": [fleet_group, "GroupId"]}]  # fmt: skip
        assert [(r["FromPort"], r["SourceSecurityGroupId"]) for r in into_fleet] == [
            (port, {"Fn::ImportValue": alb_export})
        ]


def test_every_reference_to_the_shared_stack_is_an_export_it_makes(shared_templates):
    """Strong references only (Fn::ImportValue, whatever cdk.json's default): the shared stack cannot be deleted while
    a fleet uses it, and no reference relies on Fn::GetStackOutput (not verified in China)."""
    made = exports(shared_templates)
    for stack in MEMBERS:
        text = json.dumps(shared_templates[stack])
        assert "Fn::GetStackOutput" not in text
        imported = set(re.findall(r'"Fn::ImportValue": "([^"]+)"', text))
        assert imported and imported <= set(made), imported - set(made)
        assert {made[name][0] for name in imported} <= {STACK_NAME, *(s for s in MEMBERS if s != stack)}
        assert made[target_group_export(stack)][0] == stack


def test_a_stack_balancing_an_earlier_stacks_name_deploys_after_it(shared_assembly):
    manifest = json.loads((shared_assembly / "manifest.json").read_text())["artifacts"]
    assert "GravitonMoeStack" in manifest["IntelMoeStack"]["dependencies"]
    assert "IntelMoeStack" not in manifest["GravitonMoeStack"]["dependencies"]
    for stack in MEMBERS:
        assert STACK_NAME in manifest[stack]["dependencies"]


def test_every_fleet_reads_the_one_shared_key(shared_templates):
    secret = next(iter(resources(shared_templates[STACK_NAME], "AWS::SecretsManager::Secret")))
    (export,) = [n for n, (s, v) in exports(shared_templates).items() if s == STACK_NAME and v == {"Ref": secret}]
    for stack in MEMBERS:
        text = user_data(shared_templates[stack])
        assert f'SECRET_ID=\'<{{"Fn::ImportValue": "{export}"}}>\'' in text
        policies = json.dumps(resources(shared_templates[stack], "AWS::IAM::Policy"))
        assert json.dumps({"Fn::ImportValue": export}) in policies


@pytest.mark.scan
@pytest.mark.slow
def test_the_shared_templates_are_cfn_lint_clean(shared_assembly):
    files = [str(shared_assembly / f"{s}.template.json") for s in (STACK_NAME, *MEMBERS)]
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--config-file", str(ROOT / ".cfnlintrc.yaml"), "--", *files],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize(
    "value, says",
    [
        ("GravitonMoeStack", "only GravitonMoeStack: list two or more stacks"),
        ("GravitonMoeStack,GravitonMoeStack", "a stack is listed twice"),
        ("GravitonMoeStack,NoSuchStack", "no EC2 stack named NoSuchStack; use some of"),
    ],
)
def test_a_shared_endpoint_that_cannot_work_fails_at_synth_with_what_to_change(value, says, tmp_path, capsys):
    context = {**cdk_context(), **CONTEXT, "sharedEndpoint": value}
    assert main(context, config_file=tmp_path / "absent.toml") == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: sharedEndpoint") and says in errors[0]


def test_a_shared_endpoint_refuses_to_wake_one_fleet(tmp_path, capsys):
    context = {**cdk_context(), **CONTEXT, "minCapacity": "0", "wakeOnRequest": "true"}
    assert main(context, config_file=tmp_path / "absent.toml") == 1
    err = capsys.readouterr().err
    assert "sharedEndpoint" in err and "drop wakeOnRequest" in err


def test_the_shared_stack_shows_every_fleets_traffic_and_the_load_balancers_own_errors(shared_templates):
    """One dashboard beside each fleet's own: every metric the shared load balancer's, by its LoadBalancer name."""
    from tests.stacks.eks.conftest import flat

    shared = shared_templates[STACK_NAME]
    (alb,) = resources(shared, "AWS::ElasticLoadBalancingV2::LoadBalancer")
    (dashboard,) = resources(shared, "AWS::CloudWatch::Dashboard").values()
    assert dashboard["DashboardName"] == f"{STACK_NAME}-endpoint"
    body = json.loads(flat(dashboard["DashboardBody"]).replace(f"<{alb}.LoadBalancerFullName>", "ALB"))
    metrics = [m for w in body["widgets"] for m in w["properties"]["metrics"]]
    names = {m[1] for m in metrics}
    assert {"RequestCount", "HTTPCode_ELB_4XX_Count", "HTTPCode_ELB_5XX_Count", "TargetResponseTime"} <= names
    assert all(m[0] == "AWS/ApplicationELB" and m[2:4] == ["LoadBalancer", "ALB"] for m in metrics), metrics


def test_more_rules_than_an_application_load_balancer_holds_is_refused_at_synth(tmp_path):
    """ELB's 100 rules per load balancer: each stack takes two per five names (both listeners), one more pair per five
    it balances with an earlier stack, and the first stack a catch-all."""
    import aws_cdk as cdk

    from stacks.app import plan_app
    from stacks.errors import PropsError
    from stacks.shared_endpoint import SharedEndpointStack

    plan = plan_app({**cdk_context(), **CONTEXT}, config_file=tmp_path / "absent.toml", stack_names=list(MEMBERS))
    members = list(plan.shared)
    fits = {m.stack_name: tuple(f"{m.stack_name}-{i}" for i in range(80)) for m in members}  # 32 rules each: 97
    env = cdk.Environment(region="cn-northwest-1")
    SharedEndpointStack(cdk.App(context=cdk_context()), "Fits", members=members, models=fits, env=env)
    over = {**fits, "IntelMoeStack": (*fits["IntelMoeStack"], "one-more")}  # 34 for Intel
    over["GpuMtpStack"] = (*fits["GpuMtpStack"], "and-one")  # 34 more: 100 and the catch-all
    with pytest.raises(PropsError, match="101 listener rules, more than the 100"):
        SharedEndpointStack(cdk.App(context=cdk_context()), "Over", members=members, models=over, env=env)
