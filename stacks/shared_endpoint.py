"""SharedEndpointStack (-c sharedEndpoint): one internal load balancer, one VPC and one API key for several EC2
stacks, so that one OpenAI base URL reaches every model they serve (docs/deploying.md, "Several models behind one
endpoint").

The stack names no fleet. Each stack behind it adds its own target group and rules to this load balancer's
listeners from its own template (stacks/shared_fleet.py), keeping its own scaling, drains, alarms and dashboard:
this stack deploys first (the stacks behind it reference it), and any of them deploys, updates or is destroyed
without the others. A request no fleet's rule takes is answered 404 `model_not_found`.

How a request finds its fleet: a client that names the model in the `X-Gateway-Model-Name` header is sent by the
load balancer's rule for that name straight to the fleet that serves it. A request that names it in the body only
goes to the first stack's fleet (a rule that takes every path, at the lowest precedence), whose hop serves its own
model and forwards another fleet's to this load balancer's route listener with the header set (the hop's --route;
gguf_serve/container/hop/models.py), where the same rules apply. A name two stacks serve is sent to both, equal
weight.
"""

from __future__ import annotations

from dataclasses import replace

from aws_cdk import Aspects, Aws, CfnOutput, CrossStackReferences, ReferenceStrength, Stack
from constructs import Construct

from stacks.access_logs import AccessLogs
from stacks.api_key import ApiKey
from stacks.checkov import CheckovAcknowledgements
from stacks.errors import PropsError
from stacks.load_balancer import MODEL_NAMES_PER_RULE, InferenceLoadBalancer
from stacks.nag import acknowledge
from stacks.network import ServingNetwork
from stacks.plan import ServicePlan
from stacks.shared_monitoring import SharedEndpointMonitoring

STACK_NAME = "SharedEndpointStack"
# Each stack behind the endpoint takes its rules' priorities from blocks of its own (its place in sharedEndpoint), so
# no two stacks' rules collide whichever of them deploy; the first stack's catch-all takes MAX_RULE_PRIORITY.
RULES_PER_STACK = 100
# The stacks' own rules come after every balanced rule (a name several stacks serve). With the quota below, at most
# 49 stacks fit behind one load balancer: every block stays under OWN_RULES_FROM, and the last own block under the
# catch-all's MAX_RULE_PRIORITY (stacks/load_balancer.py).
OWN_RULES_FROM = 20000
# ELB: 100 rules per Application Load Balancer, default rules excluded (ELB User Guide for Application Load
# Balancers, "Quotas for your Application Load Balancers", docs.amazonaws.cn). Each stack's names take a rule on each
# of the two listeners per MODEL_NAMES_PER_RULE names.
MAX_RULES_PER_LOAD_BALANCER = 100


def strong_references(consumer: Stack) -> None:
    """`consumer` takes the shared stack's values by export (Fn::ImportValue), whatever cdk.json's default: an
    export in use cannot be deleted (CloudFormation refuses, "Fn::ImportValue", AWS CloudFormation User Guide,
    docs.amazonaws.cn), so the shared stack cannot go while a fleet stands behind it. Fn::GetStackOutput (the
    "weak" default) is not relied on in China: it is not verified there. Called before any construct is added."""
    CrossStackReferences.of(consumer).consume(ReferenceStrength.STRONG)


class SharedEndpointStack(Stack):
    """Exposes `vpc`, `api_key`, `load_balancer` (its `listener`, `routes`, `security_group`, `url`, `route_url`),
    `members` (the stacks behind it, in order) and `models` (stack -> the names its fleet serves)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        members: list[ServicePlan],
        models: dict[str, tuple[str, ...]],
        **kwargs,
    ) -> None:
        """members: the plans of the stacks behind it, in sharedEndpoint's order: the first one's fleet serves a
        request that names no model, its network settings shape the VPC, and the load balancer keeps the longest
        idle timeout of theirs. models: each member's served names (a member whose model is not locked yet has
        none: it is refused, and routed to once it deploys)."""
        if len(members) < 2:
            raise PropsError(f"{construct_id}: {len(members)} stack(s) behind it; a shared endpoint needs two or more")
        first, options = members[0], members[0].options
        super().__init__(
            scope, construct_id, description="One endpoint for " + ", ".join(m.stack_name for m in members), **kwargs
        )
        self._azs = list(first.zones)
        self.members = tuple(m.stack_name for m in members)
        self.models = {m: models.get(m, ()) for m in self.members}
        self._check_rules()
        acknowledge(
            self,
            "CloudFormation-Validate::W3010",
            "Zones are pinned on purpose in cdk.context.json: no lookup at synth, and the user picks zones that offer "
            "the instance types.",
        )
        Aspects.of(self).add(CheckovAcknowledgements())
        network = ServingNetwork(self, "Network", settings=first.fleet.network)
        self.vpc, self.vpc_cidr = network.vpc, first.fleet.network.vpc_cidr
        access_logs = AccessLogs(self, "AccessLogs")
        self.api_key = ApiKey(self, "ApiKey")
        longest = max(m.fleet.load_balancer.alb_idle_timeout_s for m in members)
        self.load_balancer = InferenceLoadBalancer(
            self, "LoadBalancer", vpc=network.vpc, vpc_cidr=self.vpc_cidr, access_logs=access_logs.bucket,
            targets=None, settings=replace(first.fleet.load_balancer, alb_idle_timeout_s=longest),
            allowed_cidrs=options.allowed_cidrs, certificate_arn=options.certificate_arn,
        )  # fmt: skip
        self.load_balancer.share(None)  # each fleet's stack opens the route listener to its own instances
        self.monitoring = SharedEndpointMonitoring(self, "Monitoring", name=construct_id, alb=self.load_balancer.alb)
        self._outputs()

    def balanced(self, stack_name: str) -> list[tuple[list[str], list[str]]]:
        """The names `stack_name` sends to earlier stacks' fleets too: (names, those stacks), one entry per set of
        stacks. A name several stacks serve is the last one's to balance (to all of them, equal weight), so that the
        rule is written once, by a stack the others do not depend on; it takes precedence over each stack's own
        rule for the name, which serves alone again when the later stack is gone."""
        own = self.models[stack_name]
        later = self.members[self.members.index(stack_name) + 1 :]
        earlier = self.members[: self.members.index(stack_name)]
        by_peers: dict[tuple[str, ...], list[str]] = {}
        for name in own:
            peers = tuple(s for s in earlier if name in self.models[s])
            if peers and not any(name in self.models[s] for s in later):
                by_peers.setdefault(peers, []).append(name)
        return [(names, list(peers)) for peers, names in by_peers.items()]

    def routed(self, stack_name: str) -> tuple[str, ...]:
        """The names the other stacks' fleets serve and this one's does not: its hops forward them."""
        own = self.models[stack_name]
        return tuple(dict.fromkeys(n for s in self.members if s != stack_name for n in self.models[s] if n not in own))

    def priorities(self, stack_name: str) -> tuple[int, int]:
        """The first priority of the stack's balanced rules, and of its own: each stack a block of its own, every
        balanced rule before every own one (a lower number is evaluated first)."""
        index = self.members.index(stack_name)
        return RULES_PER_STACK * (1 + index), OWN_RULES_FROM + RULES_PER_STACK * index

    def _outputs(self) -> None:
        lb = self.load_balancer
        CfnOutput(self, "EndpointUrl", value=f"{lb.url}/v1",
                  description="every model of " + ", ".join(self.members) + ": OpenAI-compatible URL (VPC); name "
                  "the model in the body, or send X-Gateway-Model-Name to skip a forward")  # fmt: skip
        CfnOutput(self, "ApiKeySecretArn", value=self.api_key.secret.secret_arn, description="Secrets Manager secret")
        names = "; ".join(f"{s}: {', '.join(n) or '(not locked)'}" for s, n in self.models.items())
        CfnOutput(self, "ModelNames", value=names, description="stack: the names its fleet answers to at this endpoint")
        model = next((n[0] for n in reversed(self.models.values()) if n), "")
        CfnOutput(
            self, "CurlExample", description="Run from inside the VPC; the body's model picks the fleet",
            value=(
                f'curl -s {lb.url}/v1/chat/completions -H "Authorization: Bearer $(aws secretsmanager '
                f"get-secret-value --region {Aws.REGION} --secret-id {self.api_key.secret.secret_arn} --query "
                "SecretString --output text)\" -H 'Content-Type: application/json' "
                f'-d \'{{"model":"{model}","messages":[{{"role":"user","content":"你好"}}],"max_tokens":256}}\''
            ),
        )  # fmt: skip

    def _check_rules(self) -> None:
        """Refused at synth: more rules than a stack's priority blocks hold, or than the load balancer's quota. Each
        stack's rules, on both listeners: its own names', and the names it balances with earlier stacks."""

        def rules(names: list[str] | tuple[str, ...]) -> int:
            return 2 * -(-len(names) // MODEL_NAMES_PER_RULE)  # on the callers' listener and the route listener

        counts = {s: (rules(self.models[s]), sum(rules(n) for n, _ in self.balanced(s))) for s in self.members}
        for stack, (own, balanced) in counts.items():
            if max(own, balanced) > RULES_PER_STACK:
                raise PropsError(f"sharedEndpoint: {stack} serves {len(self.models[stack])} names, more rules than "
                                 "its priority block holds")  # fmt: skip
        total = sum(own + balanced for own, balanced in counts.values()) + 1  # the first stack's catch-all
        if total > MAX_RULES_PER_LOAD_BALANCER:
            raise PropsError(
                f"sharedEndpoint: {total} listener rules, more than the {MAX_RULES_PER_LOAD_BALANCER} an Application "
                "Load Balancer holds (ELB quotas); put fewer stacks or model aliases behind one endpoint"
            )

    @property
    def availability_zones(self) -> list[str]:
        return self._azs
