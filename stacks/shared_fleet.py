"""One EC2 fleet behind SharedEndpointStack's load balancer, written into the fleet's own stack: its target group, its
names' header rules on both listeners, the first stack's catch-all, and its hops' way to the route listener.

The shared load balancer, its listeners and its security group are imported here by their ids (references to the
shared stack's values), so every rule and security-group rule a fleet adds lives in the fleet's template: the shared
stack never refers to a fleet, and a fleet deploys, updates or goes away without touching it or the others.
"""

from __future__ import annotations

from aws_cdk import Annotations, CfnOutput, Fn, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from constructs import Construct

from gguf_serve.catalog.fleet import LoadBalancerSettings
from stacks.fleet import ServingFleet
from stacks.load_balancer import MAX_RULE_PRIORITY, ROUTE_PORT, forward_to, model_conditions, serving_group
from stacks.shared_endpoint import SharedEndpointStack


def target_group_export(stack_name: str) -> str:
    """The export a later stack behind the endpoint reads this fleet's target group from (a name both serve)."""
    return f"{stack_name}-SharedEndpointTargetGroup"


class SharedEndpointFleet(Construct):
    """Exposes what InferenceLoadBalancer does for a fleet: `alb`, `listener`, `target_group`, `url` (the shared
    endpoint's), and `route_url` (where the hops forward)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        endpoint: SharedEndpointStack,
        fleet: ServingFleet,
        settings: LoadBalancerSettings,
    ) -> None:
        """endpoint: the shared stack; fleet: this stack's; settings: its deregistration delay (the profile's)."""
        super().__init__(scope, construct_id)
        stack_name = Stack.of(self).stack_name
        lb = endpoint.load_balancer
        assert lb.routes is not None  # SharedEndpointStack shares it
        self.security_group = ec2.SecurityGroup.from_security_group_id(
            self, "AlbSecurityGroup", lb.security_group.security_group_id, allow_all_outbound=False, mutable=True
        )
        self.alb = elbv2.ApplicationLoadBalancer.from_application_load_balancer_attributes(
            self, "Alb", load_balancer_arn=lb.alb.load_balancer_arn,
            security_group_id=lb.security_group.security_group_id, load_balancer_dns_name=lb.alb.load_balancer_dns_name,
        )  # fmt: skip
        self.listener = elbv2.ApplicationListener.from_application_listener_attributes(
            self, "Listener", listener_arn=lb.listener.listener_arn, security_group=self.security_group,
            default_port=lb.port,
        )  # fmt: skip
        routes = elbv2.ApplicationListener.from_application_listener_attributes(
            self, "Routes", listener_arn=lb.routes.listener_arn, security_group=self.security_group,
            default_port=ROUTE_PORT,
        )  # fmt: skip
        self.target_group = elbv2.ApplicationTargetGroup(
            self, "Servers", vpc=endpoint.vpc, port=fleet.port, targets=[fleet.asg], **serving_group(settings)
        )
        self.url, self.route_url = lb.url, lb.route_url
        balanced, own = endpoint.priorities(stack_name)
        for names, peers in endpoint.balanced(stack_name):
            balanced = self._rules("Balanced", names, self._action(peers), balanced, routes)
        self._rules("Own", list(endpoint.models[stack_name]), forward_to([self.target_group]), own, routes)
        if endpoint.members[0] == stack_name:  # a request naming no fleet's model in a header: this fleet's hop
            self.listener.add_action(
                "Default", priority=MAX_RULE_PRIORITY, conditions=[elbv2.ListenerCondition.path_patterns(["/*"])],
                action=elbv2.ListenerAction.forward([self.target_group]),
            )  # fmt: skip
        fleet.security_group.connections.allow_to(self.security_group, ec2.Port.tcp(ROUTE_PORT), "hops' forwards")
        CfnOutput(self, "TargetGroupArn", value=self.target_group.target_group_arn,
                  export_name=target_group_export(stack_name),
                  description="this fleet's target group (a later stack's rule for a name both serve)")  # fmt: skip

    def _rules(
        self, tag: str, names: list[str], action: elbv2.ListenerAction, priority: int,
        routes: elbv2.IApplicationListener,
    ) -> int:  # fmt: skip
        """Header rules for `names` on both listeners, from `priority` on; returns the next free priority."""
        for condition in model_conditions(names):
            for listener, kind in ((self.listener, "Named"), (routes, "Routed")):
                listener.add_action(f"{tag}{kind}{priority}", priority=priority, conditions=[condition], action=action)
            priority += 1
        return priority

    def _action(self, peers: list[str]) -> elbv2.ListenerAction:
        """To this fleet and each of `peers`' with equal weight (their target groups imported by export: this stack
        then depends on theirs, never the other way; each peer's own rule registers its group and opens its
        instances to the load balancer)."""
        groups = [self.target_group]
        for peer in peers:
            imported = self.node.try_find_child(f"Peer{peer}")
            if imported is None:
                imported = elbv2.ApplicationTargetGroup.from_target_group_attributes(
                    self, f"Peer{peer}", target_group_arn=Fn.import_value(target_group_export(peer))
                )
                Annotations.of(imported).acknowledge_warning(
                    "@aws-cdk/aws-elbv2:albTargetGroupCannotRegisterListener",
                    f"{peer}'s own rule for these names registers its target group on these listeners and opens its "
                    "instances to the load balancer, in its own stack",
                )
            groups.append(imported)  # type: ignore[arg-type]
        return forward_to(groups)
